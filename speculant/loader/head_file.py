"""Draft-head files: a folder with `head.safetensors` and `head.json`.

`head.json` records the variant, the draft vocabulary size, the target the head was trained
for, with that checkpoint's sha256 (a head loaded over another target is refused, naming both),
and for an eagle3 head the target layers it reads (`feature_layers`).
DeepSeek-V3 MTP names (`model.layers.N.enorm`, `shared_head.norm`, the block's own names) map
onto the normed variant; the shared embedding and lm_head in such a file are dropped (the target's
are used). Heads trained for the registry's models ship inside the package (`speculant/heads/`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from speculant.loader.errors import CheckpointError
from speculant.models.head_features import FEATURE_VARIANT, check_feature_layers

HEADS_DIR = pathlib.Path(__file__).resolve().parent.parent / "heads"  # heads shipped for registry models
_WEIGHTS, _CONFIG = "head.safetensors", "head.json"


@dataclass(frozen=True)
class HeadFileConfig:
    variant: str  # "normed" | "eagle" | "eagle3"
    target: str  # the target's name when trained (registry name or file name)
    target_sha256: str  # the target checkpoint's sha256 (`checkpoint_sha256`)
    hidden_size: int
    draft_vocab_size: int = 0  # kept target tokens; 0: the full vocabulary
    training: dict[str, Any] = field(default_factory=dict)  # how it was made (command, steps, data)
    feature_layers: tuple[int, ...] = ()  # eagle3: the target layers whose outputs the head reads

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))  # a JSON list read back
        if (self.variant == FEATURE_VARIANT) != bool(self.feature_layers):
            raise ValueError(
                f"feature_layers: an {FEATURE_VARIANT} head names the target layers it reads, other variants none; "
                f"got variant {self.variant!r} with {list(self.feature_layers)}"
            )
        if self.feature_layers:
            check_feature_layers(self.feature_layers)  # the range: against the target, when loaded over it


@dataclass
class HeadCheckpoint:
    config: HeadFileConfig
    weights: dict[str, torch.Tensor]  # head names (`speculant.models.head`), plus "vocab_map" when reduced
    path: pathlib.Path | None = None


def save_head(folder: str | pathlib.Path, weights: dict[str, torch.Tensor], config: HeadFileConfig) -> pathlib.Path:
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    save_file(tensors, str(folder / _WEIGHTS))
    (folder / _CONFIG).write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    return folder


def load_head(folder: str | pathlib.Path, expect_sha256: str | None = None) -> HeadCheckpoint:
    """The head in `folder`; with `expect_sha256`, refuse a head trained for another target."""
    from safetensors.torch import load_file

    folder = pathlib.Path(folder).expanduser()
    for name in (_CONFIG, _WEIGHTS):
        if not (folder / name).is_file():
            raise CheckpointError(folder / name, "no such file (a head folder holds head.json and head.safetensors)")
    try:
        config = HeadFileConfig(**json.loads((folder / _CONFIG).read_text()))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(folder / _CONFIG, f"not a head config ({exc})") from None
    if expect_sha256 is not None:
        check_target(config, expect_sha256, folder)
    weights = {_canonical(k): v for k, v in load_file(str(folder / _WEIGHTS)).items()}
    return HeadCheckpoint(config, {k: v for k, v in weights.items() if k is not None and k != "_shared"}, folder)


def check_target(config: HeadFileConfig, expect_sha256: str, where) -> None:
    """Refuse a head trained for another target than the loaded one (sha256 `expect_sha256`)."""
    if config.target_sha256 != expect_sha256:
        raise CheckpointError(
            where,
            f"this head was trained for target {config.target!r} (sha256 {config.target_sha256[:12]}...), "
            f"not the loaded target (sha256 {expect_sha256[:12]}...)",
        )


def own_mtp_head(weights: dict[str, torch.Tensor], hidden_size: int) -> HeadCheckpoint:
    """A checkpoint's own MTP module (`model.layers.N.*` tensors) as a head; trained with its
    target, it records no target to check."""
    config = HeadFileConfig("normed", "the checkpoint's own MTP layer", "", hidden_size)
    return HeadCheckpoint(config, mtp_head_weights(weights))


def mtp_head_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DeepSeek-V3 MTP module's tensors (`model.layers.N.*`) under head names, shared ones dropped."""
    named = {_canonical(k): v for k, v in weights.items()}
    return {k: v for k, v in named.items() if k != "_shared"}


def _canonical(name: str) -> str:
    """Head names from DeepSeek-V3 MTP names: the block prefix dropped, `shared_head.norm` is the
    final norm, the shared embedding/lm_head are the target's (marked `_shared`)."""
    name = re.sub(r"^model\.layers\.\d+\.", "", name)
    if name in ("embed_tokens.weight", "shared_head.head.weight"):
        return "_shared"
    if name == "shared_head.norm.weight":
        return "norm.weight"
    for block in ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm."):
        if name.startswith(block):
            return "layer." + name
    return name


def default_head(model: str, target_features: bool = True) -> pathlib.Path:
    """The head shipped for a registry model, e.g. `speculant/heads/smollm2-135m`. Where the
    target cannot hand a head its feature layers' states (`target_features` False: tensor
    parallelism), the model's shipped head that reads none, `speculant/heads/<model>-normed`."""
    for name in (model, f"{model}-normed"):
        folder = HEADS_DIR / name
        if (folder / _CONFIG).is_file() and (target_features or not json.loads((folder / _CONFIG).read_text()).get("feature_layers")):
            return folder
    shipped = sorted(p.name for p in HEADS_DIR.iterdir() if (p / _CONFIG).is_file()) if HEADS_DIR.is_dir() else []
    reads = "" if target_features else " that reads no feature layers (tensor_parallel_size > 1)"
    raise ValueError(f"head: no head{reads} ships for model {model!r} (shipped: {shipped}); pass head=PATH")


_SHA_CACHE: dict[tuple, str] = {}


def checkpoint_sha256(checkpoint) -> str:
    """The sha256 of a checkpoint's file (a folder: its sorted safetensors files in turn), or of
    its tensors' bytes in name order for a checkpoint built in memory (tests)."""
    path = getattr(checkpoint, "path", None)
    if path is None:
        digest = hashlib.sha256()
        for name in sorted(checkpoint.weights):
            digest.update(name.encode())
            digest.update(checkpoint.weights[name].detach().float().contiguous().numpy().tobytes())
        return digest.hexdigest()
    path = pathlib.Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key not in _SHA_CACHE:
        digest = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    digest.update(chunk)
        _SHA_CACHE[key] = digest.hexdigest()
    return _SHA_CACHE[key]
