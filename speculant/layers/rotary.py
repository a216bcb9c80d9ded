"""Rotary position embeddings (Su et al. 2021) in the Hugging Face "rotate half" layout, with
Llama 3, linear and YaRN (Peng et al. 2023, as DeepSeek-V3 configures it) scaling."""

from __future__ import annotations

import math

import torch

from speculant.config import ArchConfig, RopeScaling
from speculant.kernels import native


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:  # [D/2]
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling.kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    elif scaling.kind == "linear":
        inv_freq = inv_freq / scaling.factor
    elif scaling.kind == "yarn":
        inv_freq = _yarn_scale(inv_freq, head_dim, theta, scaling)
    elif scaling.kind not in ("none", "default"):
        raise ValueError(f"rope scaling {scaling.kind!r} is not supported")
    return inv_freq.float()


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: long wavelengths slowed, short kept, smooth between."""
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(middle, blended, scaled)


def _yarn_scale(inv_freq: torch.Tensor, dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN's ramp: dimensions with fewer than beta_slow rotations over the original context are
    interpolated (divided by factor), those with more than beta_fast kept, linear between."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return inv_freq / s.factor * ramp + inv_freq * (1 - ramp)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rotary_amplitude(scaling: RopeScaling) -> float:
    """YaRN's factor on cos/sin (1 for the other kinds)."""
    if scaling.kind != "yarn":
        return 1.0
    if scaling.mscale and scaling.mscale_all_dim:
        return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return yarn_mscale(scaling.factor)


class RotaryEmbedding:
    """Holds cos/sin tables for every position; `lookup` gathers them once per forward."""

    def __init__(self, arch: ArchConfig, device: torch.device, dtype: torch.dtype) -> None:
        inv_freq = inverse_frequencies(arch.head_dim, arch.rope_theta, arch.rope_scaling)
        positions = torch.arange(arch.max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [P, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        amplitude = rotary_amplitude(arch.rope_scaling)
        self.cos = (emb.cos() * amplitude).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * amplitude).to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, 1, D] for positions [T]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] (q and k heads may be stacked along H); cos, sin: [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rotate_heads(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first `heads` heads of each row of x [T, N] (q and k heads side by side, then e.g. v)
    rotated -> [T, heads, head_dim]: in place in x by one native call on a CPU where nothing needs
    gradients, else `apply_rotary` into a new tensor; the same values either way. cos, sin:
    [T, 1, D] as `lookup` gives them."""
    part = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
    kernels = native.module() if _native_fits(x, cos) else None
    if kernels is None:
        return apply_rotary(part, cos, sin)
    kernels.rotary_(x, cos.reshape(x.shape[0], head_dim), sin.reshape(x.shape[0], head_dim), heads, head_dim)
    return part


def _native_fits(x: torch.Tensor, cos: torch.Tensor) -> bool:
    if x.device.type != "cpu" or x.dtype != torch.float32 or cos.dtype != torch.float32 or not x.is_contiguous():
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)
