"""`speculant train-head` end to end on a tiny model folder: every stage runs, a rerun resumes
without redoing anything, evaluation sets are refused with a one-line error."""

from __future__ import annotations

import json

from speculant.cli import main
from speculant.loader.head_file import load_head
from speculant.training.hidden import MANIFEST


def _data(tmp_path):
    path = tmp_path / "data" / "gsm.jsonl"
    path.parent.mkdir()
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(model_dir, data, out, *extra):
    return [
        "train-head", "--model", str(model_dir), "--data", str(data), "--out", str(out),
        "--max-new-tokens", "8", "--gen-batch", "4", "--steps", "3", "--batch-tokens", "64",
        "--warmup-steps", "1", "--draft-vocab", "50", "--no-progress", *extra,
    ]


def test_all_stages_run_and_a_rerun_resumes(tmp_path, model_dir, capsys):
    data, out = _data(tmp_path), tmp_path / "out"
    held_aside = ("--validate-prompts", "2", "--validate-k", "2")
    assert main(_args(model_dir, data, out, "--unroll", "2", *held_aside)) == 0
    err = capsys.readouterr().err
    assert "command: speculant train-head --model" in err and "validation: k=2: tau" in err
    rows = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["gsm:1", "gsm:2", "gsm:3", "gsm:4"]  # the last 2 are held aside
    assert all(len(r["response_ids"]) <= 8 for r in rows)
    (validation,) = json.loads((out / "train" / "validation.json").read_text())
    assert validation["num_prompts"] == 2 and len(validation["acceptance_by_position"]) == 2
    assert 1.0 <= validation["tau"] <= 3.0
    head = load_head(out / "train" / "head")
    assert head.config.variant == "normed" and head.config.draft_vocab_size == 50
    assert head.config.training["command"].startswith("speculant train-head")
    done = [out / "responses.jsonl", out / "hidden" / MANIFEST, out / "hidden" / "shard-00000.safetensors"]
    stamps = [p.stat().st_mtime_ns for p in done]
    assert main(_args(model_dir, data, out, "--unroll", "2", "--steps", "5", *held_aside)) == 0  # resumes, trains on
    assert [p.stat().st_mtime_ns for p in done] == stamps  # the data stages had nothing left to do
    log = (out / "train" / "train_log.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in log[1:]] == ["1", "2", "3", "4", "5"]


def test_dataset_responses_and_stop_after(tmp_path, model_dir):
    data, out = _data(tmp_path), tmp_path / "out"
    assert main(_args(model_dir, data, out, "--responses", "dataset", "--stop-after", "hidden")) == 0
    first = json.loads((out / "responses.jsonl").read_text().splitlines()[0])
    assert first["response_ids"][-1] == 2  # the answer, then end-of-sequence
    assert json.loads((out / "hidden" / MANIFEST).read_text())["complete"]
    assert not (out / "train").exists()


def test_evaluation_sets_are_refused(tmp_path, model_dir, capsys):
    bench = tmp_path / "mt_bench" / "question.jsonl"
    bench.parent.mkdir()
    bench.write_text(json.dumps({"prompt": "x"}) + "\n")
    assert main(_args(model_dir, bench, tmp_path / "out")) == 2
    assert "evaluation sets; never train on them" in capsys.readouterr().err


def test_an_eagle3_head_trains_validates_and_resumes(tmp_path, model_dir, capsys):
    data, out = _data(tmp_path), tmp_path / "out"
    eagle3 = ("--variant", "eagle3", "--feature-layers", "0,1,1", "--unroll", "2", "--validate-prompts", "2", "--validate-k", "2")
    assert main(_args(model_dir, data, out, *eagle3)) == 0
    assert "validation: k=2: tau" in capsys.readouterr().err  # MTP through the engine, the target exposing its layers
    assert json.loads((out / "hidden" / MANIFEST).read_text())["settings"]["feature_layers"] == [0, 1, 1]
    head = load_head(out / "train" / "head")
    assert head.config.variant == "eagle3" and head.config.feature_layers == (0, 1, 1)
    assert head.weights["lm_head.weight"].shape == (50, 64)  # its own lm_head over the draft vocabulary
    assert main(_args(model_dir, data, out, *eagle3, "--steps", "4")) == 0  # resumes, trains on
    log = (out / "train" / "train_log.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in log[1:]] == ["1", "2", "3", "4"]
    capsys.readouterr()
    assert main(_args(model_dir, data, out, "--variant", "eagle3", "--feature-layers", "1,1,1")) == 2
    assert "holds the states of feature layers [0, 1, 1], this run needs feature layers [1, 1, 1]; delete" in capsys.readouterr().err


def test_bad_feature_layers_are_refused_by_name(tmp_path, model_dir, capsys):
    data = _data(tmp_path)
    assert main(_args(model_dir, data, tmp_path / "a", "--variant", "eagle3", "--feature-layers", "0,1")) == 2
    assert "feature_layers: an eagle3 head reads 3 target layers, got [0, 1]" in capsys.readouterr().err
    assert main(_args(model_dir, data, tmp_path / "b", "--variant", "eagle3", "--feature-layers", "0,1,7")) == 2
    assert "feature_layers: the target has layers 0..1, got [0, 1, 7]" in capsys.readouterr().err
    assert main(_args(model_dir, data, tmp_path / "c", "--feature-layers", "0,1,1")) == 2
    assert "feature_layers: only the eagle3 variant reads feature layers, not 'normed'" in capsys.readouterr().err
