"""`python -m speculant.distributed.run_worker PAYLOAD`: one tensor-parallel worker, started by the
leader (`processes.py`). It reads its start-up arguments from the payload file, then serves the
leader (`worker.worker_main`) until STOP; it ends itself as soon as the leader's end of its stdin
closes, so it never outlives the leader."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
from pathlib import Path

from speculant.distributed.worker import worker_main

LEADER_GONE_STATUS = 3  # the exit status of a worker whose leader went away


def main(argv: list[str]) -> int:
    payload = Path(argv[0])
    watch_leader(payload.parent)
    worker_main(*read_payload(payload))
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
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(LEADER_GONE_STATUS)

    threading.Thread(target=wait_for_end, name="leader-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
