"""`speculant serve` over two tensor-parallel ranks (the target read from its folder in
slices): it serves, and when a worker dies the request in flight gets a 503 and the server
exits with status 1 instead of hanging."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import httpx
import pytest
from server_helpers import MODEL, free_port

from speculant.distributed.processes import WORKER_MODULE

SERVE_SCRIPT = """
import sys
from speculant.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig
from speculant.server import ServerOptions, run_server
config = EngineConfig(
    model=ModelConfig(model=sys.argv[1]), cache=CacheConfig(page_size=16, num_pages=256),
    parallel=ParallelConfig(tensor_parallel_size=2, worker_timeout_s=5),
)
sys.exit(run_server(config, "127.0.0.1", int(sys.argv[2]), model_name="tiny-smol", options=ServerOptions(drain_timeout_s=1.0), log_level="warning"))
"""
BODY = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny_model, smol_tokenizer):
    folder = tmp_path_factory.mktemp("tiny-smol-tp")
    tiny_model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


def spawned_workers(pid: int) -> list[int]:
    """The server's tensor-parallel workers: its children running the worker module."""
    children = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    module = WORKER_MODULE.encode()
    return [int(c) for c in children if module in pathlib.Path(f"/proc/{c}/cmdline").read_bytes()]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up")


def test_a_dead_worker_gets_503_and_a_nonzero_exit(tiny_folder):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(tiny_folder), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        assert httpx.post(f"{url}/v1/completions", json=BODY, timeout=60).status_code == 200
        (worker,) = spawned_workers(proc.pid)
        os.kill(worker, signal.SIGKILL)
        response = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60)
        assert response.status_code == 503, response.text
        assert "tensor-parallel worker" in response.json()["error"]["message"]
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
