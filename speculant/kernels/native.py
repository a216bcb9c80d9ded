"""The native CPU kernels (`csrc/`), compiled once per machine with torch's C++ extension builder.

`module()` returns the loaded extension, building it into `$SPECULANT_CACHE/native/<hash>` on the
first call (about a minute on two cores; `make install` does it ahead, `python -m
speculant.kernels.native` too), or None where it cannot be built or `SPECULANT_NATIVE=0` asks for
the pure-torch kernels. The build's name carries a hash of the sources and flags, so a changed
kernel is rebuilt and never mixed with an old one. Which vector path runs is `utils.cpu`'s answer
(`use_avx2()`, and `simd()` for the quantized products and the stack), decided per call, so a test can
cap the CPU at run time.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pathlib
import sys

import torch

from speculant.utils import cpu
from speculant.utils.paths import cache_dir

_SOURCES = ("products.cpp", "int4.cpp", "dense.cpp", "norms.cpp", "argmax.cpp", "attention.cpp", "stack.cpp", "bindings.cpp")
_HEADERS = ("simd.h", "kernels.h", "products.h", "attention_parts.h")
_CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-std=c++17"]
log = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get("SPECULANT_NATIVE", "1") != "0"


def available() -> bool:
    return module() is not None


def use_avx2() -> bool:
    return cpu.has_avx2()


def simd() -> int:
    """The quantized products' (and the decoder stack's) path: 2 AVX-512 (tiles of 8 rows), 1
    AVX2 (tiles of 4), 0 scalar; every path gives the same bits."""
    return 2 if cpu.has_avx512() else 1 if cpu.has_avx2() else 0


def module():
    """The extension, or None (disabled, or the build failed: the reason is logged once)."""
    return _load() if enabled() else None


@functools.cache
def source_tag() -> str:
    """A hash of the kernels' sources and build flags: names the build, and keys anything measured
    with these kernels (the step cost calibration)."""
    src = pathlib.Path(__file__).parent / "csrc"
    digest = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        digest.update((src / name).read_bytes())
    digest.update(" ".join(_CFLAGS + [torch.__version__, sys.version]).encode())
    return digest.hexdigest()[:12]


@functools.cache
def _load():
    src = pathlib.Path(__file__).parent / "csrc"
    tag = source_tag()
    build = cache_dir() / "native" / tag
    build.mkdir(parents=True, exist_ok=True)
    built = build / f"speculant_native_{tag}.so"
    if built.exists():  # built before: import it without the builder's lock (a killed build leaves
        try:  # one behind, and every later process would wait on it); a broken file is rebuilt
            return _import(f"speculant_native_{tag}", built)
        except ImportError:
            built.unlink()
    try:
        from torch.utils.cpp_extension import load

        return load(
            name=f"speculant_native_{tag}",
            sources=[str(src / name) for name in _SOURCES],
            extra_cflags=_CFLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=os.environ.get("SPECULANT_NATIVE_VERBOSE") == "1",
        )
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch kernels serve
        log.warning("native kernels unavailable (%s: %s); using the pure-torch kernels", type(exc).__name__, exc)
        return None


def _import(name: str, path: pathlib.Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


if __name__ == "__main__":
    loaded = module()
    print(f"native kernels: {'built' if loaded is not None else 'unavailable'}; CPU {cpu.summary()}")
    sys.exit(0 if loaded is not None else 1)
