"""`python -m speculant.distributed.run_worker PAYLOAD`: one tensor-parallel worker, started by the
leader (`processes.py`). It reads its start-up arguments from the payload file, then serves the
leader (`worker.worker_main`) until STOP; it ends itself as soon as the leader's end of its stdin
closes, so it never outlives the leader."""

from __future__ import annotations

import os
import pickle
import select
import shutil
import sys
import threading
from pathlib import Path

from speculant.distributed.worker import worker_main

LEADER_GONE_STATUS = 3  # the exit status of a worker whose leader went away
LEADER_GONE_WAIT_S = 1.0  # how long a failed worker looks for its stdin's end before it raises


def main(argv: list[str]) -> int:
    payload = Path(argv[0])
    watch_leader(payload.parent)
    args = read_payload(payload)
    try:
        worker_main(*args)
    except BaseException:
        # A leader that dies also breaks the worker's connections: the error may come before the
        # watcher has seen stdin end. Its end is what says the leader is gone; then clean up as the watcher would.
        if leader_gone(LEADER_GONE_WAIT_S):
            leave(payload.parent)
        raise
    return 0


def read_payload(payload: Path) -> tuple:
    """The worker's arguments. The leader's sys.path entries this interpreter lacks are appended
    first, so whatever the leader pickled can be unpickled here."""
    with payload.open("rb") as f:
        sys.path.extend(entry for entry in pickle.load(f) if entry not in sys.path)
        args = pickle.load(f)
    payload.unlink()
    return args


def watch_leader(folder: Path) -> None:
    """A thread that ends the process when stdin reaches its end. The leader closes it only after
    its workers have exited, so a worker that sees the end has lost its leader: it removes the
    leader's temporary `folder` (its log included), which no one else will, and exits."""

    def wait_for_end() -> None:
        while os.read(0, 4096):  # the raw descriptor: sys.stdin's buffer lock would stop the interpreter's exit
            pass
        leave(folder)

    threading.Thread(target=wait_for_end, name="leader-watch", daemon=True).start()


def leader_gone(wait_s: float) -> bool:
    """True once stdin reads as ended within `wait_s` (nothing is ever written to it, so readable means ended)."""
    return bool(select.select([0], [], [], wait_s)[0])


def leave(folder: Path) -> None:
    """The leader is gone: remove its temporary folder, which no one else will, and exit."""
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(LEADER_GONE_STATUS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
