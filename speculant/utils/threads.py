"""How torch's OpenMP threads wait between parallel regions; set before torch is imported.

A forward of a small model is hundreds of short parallel regions (a product of smollm2 takes
15-50 µs). With GNU OpenMP's defaults here a worker thread that finds no work soon sleeps on a
futex, and waking it again cost ~50 µs on a 2-vCPU virtual machine, more than the product itself:
two threads ran a one-row smollm2 forward slower than one thread did. Waiting "actively" keeps it
spinning across the gaps inside a forward (its throttled spin, ~1000 rounds, where GNU OpenMP
counts more threads than CPUs; else `SPINCOUNT` rounds, a few milliseconds), and an idle process
still sleeps (measured: no CPU time over 3 idle seconds), so a server with nothing to do burns no
core. Measured in docs/results/native_kernels.md "Threads that wait".

Only defaults: a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. GNU OpenMP reads them once,
when torch is first imported, so `speculant/__init__.py` calls `prepare_openmp` before it imports
anything else; a process that imported torch first keeps whatever it had, and is told so once.
"""

from __future__ import annotations

import os
import sys
import warnings

WAIT_POLICY = "ACTIVE"
SPINCOUNT = "300000"  # GNU OpenMP's own spin for an unset policy (~3 ms), not its 5 minutes for ACTIVE


def prepare_openmp(environ: dict | None = None, torch_loaded: bool | None = None) -> None:
    """Default OMP_WAIT_POLICY and GOMP_SPINCOUNT in `environ` (the process's by default); a
    warning where torch (`torch_loaded`: whether it is imported already) has read them before."""
    environ = os.environ if environ is None else environ
    torch_loaded = "torch" in sys.modules if torch_loaded is None else torch_loaded
    if torch_loaded and "OMP_WAIT_POLICY" not in environ:
        warnings.warn(
            "torch was imported before speculant, so its OpenMP threads keep waiting passively: small models "
            "decode up to ~1.6x slower on some machines; import speculant first or set OMP_WAIT_POLICY=ACTIVE",
            RuntimeWarning, stacklevel=3,
        )
    environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)
    environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
