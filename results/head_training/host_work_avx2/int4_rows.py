"""What each verified row adds to an int4 product on this CPU: one `layers.linear` int4 product
(random weights, N x K) at 1, 2, 3, 4 and 8 activation rows, interleaved over 300 rounds, the
minimum and 20th percentile in µs and the minimum's ratio to one row's.

    OMP_NUM_THREADS=T python int4_rows.py T N K
"""

import sys  # noqa: I001  (speculant before torch)
import time

import speculant  # noqa: F401  (before torch)
import torch

from speculant.layers.linear import make_linear

torch.manual_seed(0)
threads, n, k = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
product = make_linear(torch.randn(n, k) * 0.02, None, "int4", torch.float32)
inputs = {rows: torch.randn(rows, k) for rows in (1, 2, 3, 4, 8)}
times = {rows: [] for rows in inputs}
for _ in range(300):
    for rows, x in inputs.items():
        start = time.perf_counter()
        product(x)
        times[rows].append(time.perf_counter() - start)
one = min(times[1])
for rows, ts in times.items():
    ts = sorted(ts)
    print(f"{rows} rows: min {ts[0] * 1e6:.0f} us, p20 {ts[len(ts) // 5] * 1e6:.0f} us, {ts[0] / one:.2f}x one row")
