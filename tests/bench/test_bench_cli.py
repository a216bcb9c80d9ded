from __future__ import annotations

import pytest

from speculant.cli import build_parser, engine_config, main


def test_bench_options_parse():
    args = build_parser().parse_args([
        "bench", "--methods", "ngram,draft", "--batch-sizes", "16,1", "--num-prompts", "5", "--max-tokens", "32",
        "--temperature", "0.5", "--output", "out", "--peers", "--dataset", "d.jsonl",
        "--draft-model", "smollm2-135m", "--num-draft-tokens", "3",
    ])
    assert args.methods == ("none", "ngram", "draft")
    assert args.batch_sizes == (1, 16)
    assert (args.num_prompts, args.max_tokens, args.temperature, args.output, args.peers, args.dataset) == (5, 32, 0.5, "out", True, "d.jsonl")
    config = engine_config(args)
    assert config.speculative.num_draft_tokens == 3 and config.speculative.draft.model == "smollm2-135m"


def test_bench_defaults():
    args = build_parser().parse_args(["bench"])
    assert args.methods == ("none", "ngram") and args.batch_sizes == (1, 16) and args.dataset is None
    assert (args.num_prompts, args.max_tokens, args.temperature, args.peers) == (20, 64, 0.0, False)


@pytest.mark.parametrize("flag, value", [("--methods", "ngram,eagle9"), ("--batch-sizes", "1,x"), ("--batch-sizes", "0")])
def test_bad_options_are_refused_naming_the_flag(capsys, flag, value):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", flag, value])
    assert flag in capsys.readouterr().err


def test_missing_dataset_is_one_clear_line(tmp_path, capsys):
    assert main(["bench", "--dataset", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "nope.jsonl does not exist" in err and "Traceback" not in err


def test_speculative_flag_points_to_methods(capsys):
    assert main(["bench", "--speculative", "ngram"]) == 2
    assert "--methods" in capsys.readouterr().err
