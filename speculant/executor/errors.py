"""What the executor raises when it can run no more forwards."""

from __future__ import annotations


class ExecutorFailed(RuntimeError):
    """The executor is gone for good (a tensor-parallel worker died or hung): every later
    forward raises this too; a server stops serving."""
