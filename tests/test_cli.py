"""The command line: engine flags come from the config tree, method choices from the registry."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from test_config_options import argv_of, everything_changed

from speculant.cli import build_parser, engine_config, main
from speculant.config import EngineConfig
from speculant.config_options import engine_options
from speculant.speculative import registry
from speculant.speculative.registry import available_methods

ENGINE_COMMANDS = ["generate", "serve"]
REQUIRED = {"generate": ["--prompt", "hi"], "serve": []}


def subparser(command: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_help_lists_every_engine_flag(command, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for opt in engine_options():
        assert opt.flag in text


def test_top_level_help(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0
    assert "generate" in capsys.readouterr().out


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_parsing_round_trips_to_the_same_config(command):
    config = everything_changed()
    args = build_parser().parse_args([command, *REQUIRED[command], *argv_of(config)])
    assert engine_config(args) == config
    assert engine_config(build_parser().parse_args([command, *REQUIRED[command]])) == EngineConfig()


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_speculative_choices_are_the_registry_methods(command):
    (action,) = [a for a in subparser(command)._actions if "--speculative" in a.option_strings]
    assert action.choices == available_methods()


def test_listing_methods_imports_no_proposer():
    code = (
        "import sys; from speculant.cli import build_parser; build_parser()\n"
        "from speculant.config_options import engine_options; [o.choices for o in engine_options()]\n"
        "print(' '.join(m for m in sys.modules if m.startswith('speculant.speculative.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    proposer_modules = {path.split(":")[0] for path in registry._PROPOSERS.values()}
    assert "speculant.speculative.registry" in out.split()
    assert not proposer_modules & set(out.split())


def test_ngram_flags_reach_the_config():
    args = build_parser().parse_args(["serve", "--speculative", "ngram", "--ngram-max-n", "6", "--ngram-min-n", "3"])
    ngram = engine_config(args).speculative.ngram
    assert (ngram.max_n, ngram.min_n) == (6, 3)


def test_a_bad_value_is_one_line_naming_the_option(capsys):
    assert main(["generate", "--prompt", "hi", "--ngram-min-n", "9"]) == 2
    assert "ngram_min_n" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--page-size", "many"])
    assert "--page-size" in capsys.readouterr().err
