"""The one place that asks what this CPU can run.

Every CPU-feature question in speculant (which kernels the autotuner may offer, which path the
native kernels take, which tests skip) goes through `features()`. `SPECULANT_CPU_LEVEL` caps the
answer, so a machine with AVX-512 can run the suite as an AVX2-only one would:

- `SPECULANT_CPU_LEVEL=avx2`: only the features an AVX2 machine has (no AVX-512, no AMX, no
  AVX-VNNI/NE-convert);
- `SPECULANT_CPU_LEVEL=scalar`: no vector extensions at all (the portable code paths);
- unset: what `/proc/cpuinfo` reports.

torch's own checks read the real CPU: pair the cap with `ATEN_CPU_CAPABILITY=avx2` for ATen's
dispatch, and offer oneDNN's half-precision kernels only where `features()` allows them.
"""

from __future__ import annotations

import functools
import os

LEVELS = ("scalar", "avx2", "native")
_AVX2_LEVEL = frozenset({"sse4_1", "sse4_2", "ssse3", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "popcnt"})


@functools.cache
def _reported() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def level() -> str:
    """The cap in force: "native" (none), "avx2" or "scalar" (read at each call: a test may set it)."""
    return _level(os.environ.get("SPECULANT_CPU_LEVEL"))


@functools.cache
def _level(raw: str | None) -> str:
    value = (raw or "native").strip().lower() or "native"
    if value not in LEVELS:
        raise ValueError(f"SPECULANT_CPU_LEVEL must be one of {LEVELS}, got {value!r}")
    return value


def features() -> frozenset[str]:
    """The CPU's feature flags (cpuinfo names: avx2, fma, avx512f, avx512_bf16, ...) under the cap."""
    return _capped(level())


@functools.cache
def _capped(cap: str) -> frozenset[str]:
    reported = _reported()
    if cap == "scalar":
        return frozenset()
    if cap == "avx2":
        return reported & _AVX2_LEVEL
    return reported


def has(*names: str) -> bool:
    return all(n in features() for n in names)


def has_avx2() -> bool:
    """The native kernels' AVX2 path: AVX2 with FMA and F16C (x86-64-v3). Asked once per product,
    so it costs one environment lookup."""
    return _has_avx2(level())


@functools.cache
def _has_avx2(cap: str) -> bool:
    return {"avx2", "fma", "f16c"} <= _capped(cap)


def has_avx512() -> bool:
    """The native quantized products' AVX-512 build (32 vector registers: tiles of 8 rows): AVX-512 F,
    VL and BW besides the AVX2 path's features."""
    return _has_avx512(level())


@functools.cache
def _has_avx512(cap: str) -> bool:
    return _has_avx2(cap) and {"avx512f", "avx512vl", "avx512bw"} <= _capped(cap)


def has_native_bf16() -> bool:
    """oneDNN's bf16 products: AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, as its own check asks."""
    return has("avx512bw", "avx512vl", "avx512dq") or has("avx_ne_convert")


def summary() -> str:
    """One line for logs and benchmark JSON: the cap and the vector features that matter here."""
    keys = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile")
    return f"{level()}: " + (" ".join(k for k in keys if k in features()) or "no vector features")
