"""README.md as a user meets it: at most 250 lines, and its commands run. Every `speculant`
command line parses with the CLI's own parser, every `python -m` module exists, every `make`
target is in the Makefile, and the first quick-start command runs for real on smollm2-135m."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from speculant import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def commands() -> list[list[str]]:
    """The README's speculant, python -m and make commands (bash blocks; continuation lines
    joined, trailing comments dropped; curl lines carry JSON and are left to the server tests)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.split(" ", 1)[0] in ("speculant", "python", "make"):
                out.append(shlex.split(line.split("  #", 1)[0]))
    return out


def test_the_readme_is_a_page_a_user_reads_in_minutes():
    assert len(README.splitlines()) <= 250


def test_every_command_names_what_exists():
    seen = {"speculant": 0, "python": 0, "make": 0}
    makefile = (ROOT / "Makefile").read_text()
    for words in commands():
        if words[0] == "speculant":
            cli.build_parser().parse_args(words[1:])  # an unknown flag or choice exits here
        elif words[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(words[2]) is not None, words[2]
        elif words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), words[1]
        else:
            continue
        seen[words[0]] += 1
    assert all(seen.values()), seen


@pytest.mark.real_model
def test_the_first_quick_start_command_runs(capsys):
    first = next(w for w in commands() if w[:2] == ["speculant", "generate"])
    assert cli.main(first[1:]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() and "tok/s" in printed.err  # the text, then the stats line
