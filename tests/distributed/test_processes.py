"""Workers as processes of their own (`python -m speculant.distributed.run_worker`): a worker that
fails at start fails the leader with the tail of its output; a worker never outlives its leader,
even one still starting (it has no socket to the leader yet: only the stdin pipe tells it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import tiny_hf_model, tiny_llm

from speculant.distributed import processes
from speculant.distributed.processes import TAIL_LINES

TESTS = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def target():
    return tiny_hf_model("llama")


def test_a_worker_that_fails_at_start_reports_its_traceback(target, monkeypatch):
    """The real worker module, handed a payload that is not there: its traceback is in the error."""
    real = processes.worker_command
    monkeypatch.setattr(processes, "worker_command", lambda payload: real(payload.with_name("missing.pkl")))
    with pytest.raises(RuntimeError, match="rank 1 exited with status 1 before it was up") as error:
        tiny_llm(target, tensor_parallel_size=2)
    assert "FileNotFoundError" in str(error.value) and "missing.pkl" in str(error.value)


def test_the_error_carries_the_last_lines_of_the_worker_output(target, monkeypatch):
    script = "import sys\nfor i in range(30): print(f'line {i}', file=sys.stderr)\nsys.exit(3)"
    monkeypatch.setattr(processes, "worker_command", lambda payload: [sys.executable, "-c", script])
    with pytest.raises(RuntimeError, match="rank 1 exited with status 3 before it was up") as error:
        tiny_llm(target, tensor_parallel_size=2)
    message = str(error.value)
    assert all(f"line {i}\n" in message for i in range(30 - TAIL_LINES, 30))
    assert "line 9\n" not in message


LEADER = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from speculant.distributed import launch
from testkit import tiny_hf_model, tiny_llm

def killed_at_start(workers, stage):  # the worker is still starting: it has no socket to the leader yet
    print(workers.processes[0].pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if {starting!r}:
    launch.Workers.wait_for = killed_at_start
llm = tiny_llm(tiny_hf_model("llama"), tensor_parallel_size=2)
print(llm.engine.executor.workers.processes[0].pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie not yet reaped by its new parent counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("stage", ["starting", "serving"])
def test_a_worker_ends_when_its_leader_is_killed(tmp_path, stage):
    script = LEADER.format(tests=str(TESTS), starting=stage == "starting")
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        worker = int(leader.stdout.readline())
        folder = Path(Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")[-2].decode()).parent
        assert not _gone(worker) and folder.is_dir()
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        deadline = time.monotonic() + 30
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(worker)
        assert not folder.exists()  # the worker removed the leader's temporary folder
    finally:
        leader.kill()
