#!/usr/bin/env bash
# GPU checks, for a session lent a CUDA machine:
#   bash scripts/gpu_check.sh            (PY=/path/to/python3 to pick the interpreter)
# Runs every gpu-marked test, then whole engine steps (plain, n-gram, draft-target) under
# torch.cuda.set_sync_debug_mode("error") outside the step's one host read, with a short timing of
# overlap off vs on (scripts/gpu_engine_check.py, tiny models: no weights needed), then decode and
# tree-verification attention timings, FlashInfer against the torch backend, side by side.
#
# It uses the machine's python3 (which must hold a CUDA torch) with this checkout on PYTHONPATH, and
# installs flashinfer from the wheels in .whl/ when it is not importable. A machine that cannot
# download needs them fetched beforehand where pip works (keep .whl/ out of git); the 0.6.0 wheel
# is 7.5 MB, while 0.7.x wheels are about 100 MB:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     flashinfer-python==0.6.0 'apache-tvm-ffi>=0.1.6,<0.2'
# FlashInfer compiles its kernels with nvcc on first use, which takes minutes per dtype/head size.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print('torch', torch.__version__, '|', torch.cuda.get_device_name())"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/attention
PYTHONPATH="$PYTHONPATH:$PWD/tests" "$PY" scripts/gpu_engine_check.py

if ! "$PY" -c "import flashinfer" 2>/dev/null; then
  [ -d .whl ] || { echo "flashinfer is not importable and .whl/ holds no wheels: attention checks skipped" >&2; exit 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/flashinfer-site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/flashinfer-site"
fi
"$PY" -c "import torch, flashinfer; assert torch.cuda.is_available(), 'no CUDA'; \
print('torch', torch.__version__, '| flashinfer', flashinfer.__version__, '|', torch.cuda.get_device_name())"

"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/attention

"$PY" - <<'EOF'
"""Attention time per forward (plan + 32 layers), Llama-3-8B heads, bf16, page size 16."""
import statistics, time
import numpy as np, torch
from speculant.attention.batch import SeqInput, build_forward_batch
from speculant.attention.registry import create_backend

H, HKV, D, PAGE, LAYERS, KV_LEN = 32, 8, 128, 16, 32, 2048
cuda, dtype = torch.device("cuda"), torch.bfloat16

def batch(b: int, q_len: int):
    pages = -(-(KV_LEN + q_len) // PAGE)
    tree = np.tri(q_len, dtype=bool) if q_len > 1 else None  # a chain: the custom-mask path
    seqs = [SeqInput([0] * q_len, KV_LEN, list(range(i * pages, (i + 1) * pages)), tree_mask=tree) for i in range(b)]
    return build_forward_batch(seqs, PAGE), b * pages

def per_forward_ms(name: str, fb, num_pages: int) -> float:
    backend = create_backend(name, cuda)
    backend.configure(H, HKV, D, dtype)
    cache = [torch.randn(num_pages * PAGE, HKV, D, device=cuda, dtype=dtype) for _ in range(2)]
    q = torch.randn(fb.num_tokens, H, D, device=cuda, dtype=dtype)
    k = torch.randn(fb.num_tokens, HKV, D, device=cuda, dtype=dtype)
    times = []
    for i in range(13):
        torch.cuda.synchronize(); start = time.perf_counter()
        meta = backend.plan(fb, cuda)
        for _ in range(LAYERS):
            backend.forward(q, k, k, *cache, meta, D**-0.5)
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)

print(f"\nattention per forward, {LAYERS} layers, kv_len {KV_LEN}, H={H} Hkv={HKV} D={D}, bf16, median of 10")
print(f"{'batch':>5} {'q_len':>5} {'torch ms':>9} {'flashinfer ms':>13} {'speedup':>7}")
for b, q_len in [(1, 1), (16, 1), (64, 1), (16, 8)]:
    fb, num_pages = batch(b, q_len)
    ref, fi = per_forward_ms("torch", fb, num_pages), per_forward_ms("flashinfer", fb, num_pages)
    print(f"{b:>5} {q_len:>5} {ref:>9.2f} {fi:>13.2f} {ref / fi:>7.2f}")
EOF
