"""How torch's OpenMP threads wait between parallel regions; set before torch is imported.

A forward of a small model is hundreds of short parallel regions (a product of smollm2 takes
15-50 µs). With GNU OpenMP's defaults here, a worker thread that finds no work spins ~100 times
and then sleeps on a futex; waking it again costs ~50 µs on a virtual machine, more than the
product itself, so two threads ran a one-row smollm2 forward slower than one thread did. Waiting
"actively" makes the short spin ~1000 rounds, enough to bridge the gaps inside a forward; an idle
process still sleeps after a few milliseconds (`SPINCOUNT` bounds the long spin too), so a server
with nothing to do burns no core. Measured in docs/results/native_kernels.md "Threads that wait".

Only defaults: a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. GNU OpenMP reads them once,
when torch is first imported, so `speculant/__init__.py` calls `prepare_openmp` before it imports
anything else; a process that imported torch first keeps whatever it had.
"""

from __future__ import annotations

import os

WAIT_POLICY = "ACTIVE"
SPINCOUNT = "300000"  # GNU OpenMP's own spin for an unset policy (~3 ms), not its 5 minutes for ACTIVE


def prepare_openmp(environ: dict | None = None) -> None:
    """Default OMP_WAIT_POLICY and GOMP_SPINCOUNT in `environ` (the process's by default)."""
    environ = os.environ if environ is None else environ
    environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
