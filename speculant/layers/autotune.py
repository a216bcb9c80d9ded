"""Which dense kernel runs a float product of a given shape, measured once per machine.

Rows are bucketed (1, 2-4, 5-16, 17-64, prefill: a verify of a few drafts is its own bucket, since
on small weights the kernel that wins at 16 rows can lose by half at 2); for each weight shape and bucket every kernel the
installed PyTorch offers is timed side by side and the fastest kept (for a half-precision weight,
also widening it to float32 for the product). Choices are cached in
`$SPECULANT_CACHE/linear_kernels.json` under a key of the CPU, thread count, torch version,
dtype, candidate kernels and shape, so a later start measures nothing. `SPECULANT_LINEAR_KERNEL=<name>` forces one
kernel for every bucket (tests use it for determinism); weights under `_MIN_TUNED_BYTES` skip
the measurement and use "mm" (a few microseconds either way).
"""

from __future__ import annotations

import functools
import os
import platform
import time

import torch

from speculant.utils import cpu as speculant_cpu
from speculant.utils.json_cache import read_json, write_json
from speculant.utils.paths import cache_dir

BUCKETS = {"1": (1,), "2-4": (2, 4), "5-16": (8, 16), "17-64": (32,), "prefill": (256,)}  # bucket -> rows timed
_MIN_TUNED_BYTES = 1 << 20
_REPEATS = 15
_memo: dict[str, dict[str, str]] = {}


def bucket(rows: int) -> str:
    if rows == 1:
        return "1"
    if rows <= 4:
        return "2-4"
    if rows <= 16:
        return "5-16"
    return "17-64" if rows <= 64 else "prefill"


def _mm(x, w, packed, bias):
    return _with_bias(torch.mm(w, x.t()).t(), bias)


def _rowsplit(x, w, packed, bias):
    splits = torch.get_num_threads()
    if splits < 2 or w.shape[0] % splits:
        return _mm(x, w, packed, bias)
    rows = w.view(splits, w.shape[0] // splits, w.shape[1])  # [splits, out/splits, in]
    out = torch.bmm(rows, x.t().expand(splits, -1, -1))  # [splits, out/splits, T]
    return _with_bias(out.view(w.shape[0], x.shape[0]).t(), bias)


def _with_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = out.contiguous()  # [T, out] from a transposed [out, T] product
    return out if bias is None else out.add_(bias)


def _linear(x, w, packed, bias):
    return torch.nn.functional.linear(x, w, bias)


def _onednn(x, w, packed, bias):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _widen(x, w, packed, bias):
    """A half-precision weight widened to float32 for the product (the output is float32): on a
    CPU without bf16 dot products the half-precision GEMM of many rows is the slow one."""
    return _mm(x.float(), w.float(), None, None if bias is None else bias.float())


KERNELS = {"mm": _mm, "rowsplit": _rowsplit, "linear": _linear, "onednn": _onednn, "widen": _widen}


def available(dtype: torch.dtype = torch.float32) -> list[str]:
    """The kernels this CPU runs for a weight of `dtype`: oneDNN's half-precision products need
    what its own check asks of the CPU (`utils.cpu.has_native_bf16`)."""
    names = ["mm", "rowsplit", "linear"]
    if onednn_runs(dtype):
        names.append("onednn")
    if dtype != torch.float32:
        names.append("widen")
    return names


def onednn_runs(dtype: torch.dtype = torch.float32) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    return dtype == torch.float32 or speculant_cpu.has_native_bf16()


def forced() -> str | None:
    """The kernel `SPECULANT_LINEAR_KERNEL` forces on every dense layer, if any."""
    name = os.environ.get("SPECULANT_LINEAR_KERNEL")
    if name and name not in KERNELS:
        raise ValueError(f"SPECULANT_LINEAR_KERNEL must be one of {sorted(KERNELS)}, got {name!r}")
    return name or None


def run(kernel: str, x, w, packed, bias) -> torch.Tensor:
    """x [T, in], w [out, in] (packed: the oneDNN copy, when chosen) -> [T, out]."""
    if kernel == "onednn" and packed is None:
        kernel = "mm"
    return KERNELS[kernel](x, w, packed, bias)


def pack(weight: torch.Tensor, kernels: dict[str, str]) -> torch.Tensor | None:
    if "onednn" not in kernels.values():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def kernels_for(weight: torch.Tensor) -> dict[str, str]:
    """bucket -> kernel name for this weight's shape and dtype."""
    name = forced()
    if name:
        return dict.fromkeys(BUCKETS, name)
    if weight.device.type != "cpu" or weight.numel() * weight.element_size() < _MIN_TUNED_BYTES:
        return dict.fromkeys(BUCKETS, "mm")
    key = _key(weight)
    cache = _load_cache()
    if set(cache.get(key, ())) != set(BUCKETS):  # new, or measured under other buckets
        cache[key] = measure(weight)
        _save_cache(cache)
    return cache[key]


def measure(weight: torch.Tensor, names: list[str] | None = None) -> dict[str, str]:
    """Time every kernel per bucket, interleaved; the fastest of `_REPEATS` runs decides (on a
    shared machine the minimum is the estimate that preemption by other processes spoils least)."""
    names = names or available(weight.dtype)
    times = time_kernels(weight, sorted({r for rows in BUCKETS.values() for r in rows}), names)
    total = {b: {n: sum(times[r][n] for r in rows) for n in names} for b, rows in BUCKETS.items()}
    return {b: min(t, key=t.get) for b, t in total.items()}


def time_kernels(weight: torch.Tensor, row_counts, names: list[str], repeats: int = _REPEATS):
    """rows -> kernel -> fastest seconds; kernels take turns so load spikes hit them all."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if "onednn" in names else None
    result = {}
    for rows in row_counts:
        x = torch.randn(rows, weight.shape[1]).to(weight.dtype)
        samples: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(repeats + 1):  # the first round warms up
            for name in names:
                flush_cache()
                start = time.perf_counter()
                run(name, x, weight, packed, None)
                samples[name].append(time.perf_counter() - start)
        result[rows] = {n: min(s[1:]) for n, s in samples.items()}
    return result


def flush_cache() -> None:
    """Evict the weights from the CPU caches: in a forward every weight is read once, from
    memory, so a kernel timed on a cache-resident weight would look faster than it runs."""
    _flush_buffer().add_(1)


@functools.cache
def _flush_buffer() -> torch.Tensor:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        llc = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
    except (OSError, ValueError):
        llc = 32 << 20
    return torch.zeros(2 * llc // 4)  # float32: twice the last-level cache


def _key(weight: torch.Tensor) -> str:
    cpu = cpu_name()
    shape = "x".join(map(str, weight.shape))
    names = ",".join(available(weight.dtype))  # a kernel added later is measured, not skipped
    return f"{cpu}|{speculant_cpu.level()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}|{weight.dtype}|{names}|{shape}"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def _cache_path():
    return cache_dir() / "linear_kernels.json"


def _load_cache() -> dict[str, dict[str, str]]:
    if not _memo:
        _memo.update(read_json(_cache_path()))
    return _memo


def _save_cache(cache: dict[str, dict[str, str]]) -> None:
    write_json(_cache_path(), cache)
