"""A tensor-parallel worker as a process of its own: `python -m speculant.distributed.run_worker
PAYLOAD`, a fresh interpreter that never re-runs the caller's main module, so an `LLM` with
`tensor_parallel_size` > 1 works the same from a script (guarded or not), `python -c`, a script
piped to `python -` or a notebook.

The leader pickles each worker's start-up arguments (rank, world size, rendezvous, config, its
slices of an in-memory checkpoint), after its own `sys.path` so the worker can unpickle whatever
the leader could import, into a file in a temporary folder. The worker's stdout and stderr go to a
log file there; an error about a worker carries the log's last lines. The worker's stdin is a
pipe from the leader that nothing writes to: when the leader exits, however it exits, the pipe
closes and the worker ends itself, so no worker outlives its leader.
"""

from __future__ import annotations

import os
import pickle
import shutil
import site
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

TAIL_LINES = 20  # of a worker's log, in an error about it
WORKER_MODULE = "speculant.distributed.run_worker"


def worker_command(payload: Path) -> list[str]:
    """The command line that starts one worker from its payload file."""
    return [sys.executable, "-m", WORKER_MODULE, str(payload)]


class WorkerProcess:
    """One worker started by the leader: its process, its log and the pipe it watches."""

    def __init__(self, rank: int, folder: Path, args: tuple) -> None:
        self.rank = rank
        payload, self.log_path = folder / f"rank{rank}.pkl", folder / f"rank{rank}.log"
        with payload.open("wb") as f:
            pickle.dump(list(sys.path), f)
            pickle.dump(args, f, protocol=pickle.HIGHEST_PROTOCOL)
        with self.log_path.open("wb") as log:
            # A session of its own: a Ctrl-C at the terminal reaches the leader alone, which stops the workers in order.
            self.popen = subprocess.Popen(
                worker_command(payload), stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=worker_env(), start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        """The exit status (negative: killed by that signal), or None while it runs."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout_s: float | None = None) -> None:
        """Wait up to `timeout_s` for the worker to exit (returns either way)."""
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self.popen.kill()

    def release(self) -> None:
        """Close the leader's end of the worker's stdin (a worker still running then ends itself)."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last `lines` lines the worker wrote to stdout or stderr."""
        try:
            with self.log_path.open("rb") as log:
                kept = deque(log, maxlen=lines)
        except OSError:
            return ""
        return b"".join(kept).decode(errors="replace").rstrip()


def start_workers(world_size: int, host: str, port: int, config, parts: list) -> tuple[Path, list[WorkerProcess]]:
    """(the temporary folder, ranks 1..world_size-1 started); `parts[rank - 1]` is that rank's
    slices of an in-memory checkpoint, or None (it reads its own)."""
    folder = Path(tempfile.mkdtemp(prefix="speculant-tp-"))
    return folder, [WorkerProcess(rank, folder, (rank, world_size, host, port, config, parts[rank - 1])) for rank in range(1, world_size)]


def remove_folder(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def worker_env() -> dict[str, str]:
    """The leader's environment, less torchrun's per-process LOCAL_RANK (a worker's device comes
    from its rank), with speculant's own folder on PYTHONPATH where the interpreter would not find
    it (a source checkout on the leader's sys.path); unbuffered, so a log is whole at any time."""
    env = {key: value for key, value in os.environ.items() if key != "LOCAL_RANK"}
    root = str(Path(__file__).resolve().parents[2])  # the folder holding `speculant/`
    if root not in _site_folders():
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _site_folders() -> set[str]:
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return {str(Path(folder).resolve()) for folder in folders}
