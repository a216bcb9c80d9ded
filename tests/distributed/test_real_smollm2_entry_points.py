"""`LLM(model="smollm2-135m", tensor_parallel_size=2)` from every way of running Python code that
multiprocessing's spawn could not serve: `python -c`, a script piped to `python -`, and a script
file without an `if __name__ == "__main__":` guard. Each generates the tokens one rank does, and
the caller's code runs once (workers never re-run it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speculant import LLM, SamplingParams

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
OPTIONS = dict(weights="fp32", speculative="none")
SCRIPT = f"""
import json
from speculant import LLM, SamplingParams
with open("runs.txt", "a") as runs:
    runs.write("ran\\n")
llm = LLM(model="smollm2-135m", tensor_parallel_size=2, **{OPTIONS!r})
(out,) = llm.generate([{PROMPT!r}], SamplingParams(max_tokens={PARAMS.max_tokens}, temperature=0, ignore_eos=True))
print(json.dumps(out.token_ids))
"""  # no close(): the workers are stopped when the script ends


@pytest.fixture(scope="module")
def one_rank() -> list[int]:
    (out,) = LLM(model="smollm2-135m", **OPTIONS).generate([PROMPT], PARAMS)
    return out.token_ids


def _command(how: str, tmp_path) -> tuple[list[str], str | None]:
    """(argv, stdin) running SCRIPT the way `how` says."""
    if how == "-c":
        return [sys.executable, "-c", SCRIPT], None
    if how == "stdin":
        return [sys.executable, "-"], SCRIPT
    (tmp_path / "unguarded.py").write_text(SCRIPT)
    return [sys.executable, "unguarded.py"], None


@pytest.mark.parametrize("how", ["-c", "stdin", "file"])
def test_two_ranks_from_any_entry_point_generate_what_one_rank_does(one_rank, tmp_path, how):
    argv, stdin = _command(how, tmp_path)
    run = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-8000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == one_rank
    assert (tmp_path / "runs.txt").read_text() == "ran\n"
