"""Teacher-forced head agreement: on a training run's shards it equals the trainer's held-out
scores; on prompts the target answers greedily (MT-bench turns) it scores those answers, per
category; bad input is refused by name."""

from __future__ import annotations

import json

import pytest

from speculant.cli import main as cli
from speculant.training.agreement import main, read_prompts


def _run(tmp_path, model_dir):
    data = tmp_path / "data" / "qa.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"Say {i} times hello, please."}) + "\n" for i in range(8)))
    out = tmp_path / "run"
    args = ["train-head", "--model", str(model_dir), "--data", str(data), "--out", str(out), "--max-new-tokens", "8",
            "--gen-batch", "4", "--steps", "4", "--batch-tokens", "64", "--warmup-steps", "1", "--draft-vocab", "50",
            "--variant", "eagle3", "--feature-layers", "0,1,1", "--unroll", "2", "--heldout", "3", "--checkpoint-every", "4",
            "--no-progress"]
    assert cli(args) == 0
    return out


def test_training_shards_score_as_the_trainers_heldout_and_prompts_by_category(tmp_path, model_dir, capsys):
    run = _run(tmp_path, model_dir)
    scores = tmp_path / "train.json"
    assert main(["--head", str(run / "train" / "head"), "--model", str(model_dir), "--hidden", str(run / "hidden"),
                 "--heldout", "3", "--output", str(scores)]) == 0
    got = json.loads(scores.read_text())
    logged = (run / "train" / "train_log.csv").read_text().splitlines()
    last = dict(zip(logged[0].split(","), logged[-1].split(",")))
    assert got["all"]["conversations"] == 3 and set(got) == {"all", "qa"}
    for key in ("acc_1", "kl_1", "acc_2", "kl_2"):
        assert got["all"][key] == pytest.approx(float(last[f"val_{key}"]), rel=1e-5, abs=1e-6)

    bench = tmp_path / "mt.jsonl"
    rows = [{"question_id": i, "category": cat, "turns": [f"Tell me about {cat} number {i}.", "And again?"]}
            for i, cat in enumerate(["writing", "math", "writing"])]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scores = tmp_path / "mt_scores.json"
    assert main(["--head", str(run / "train" / "head"), "--model", str(model_dir), "--prompts", str(bench),
                 "--max-tokens", "6", "--out", str(tmp_path / "answers"), "--output", str(scores)]) == 0
    got = json.loads(scores.read_text())
    assert {k: v["conversations"] for k, v in got.items()} == {"all": 3, "writing": 2, "math": 1}
    assert all(0.0 <= v["acc_1"] <= 1.0 and v["kl_1"] >= 0.0 and 0.0 < v["target_p1"] <= 1.0 for v in got.values())
    assert "writing" in capsys.readouterr().out
    again = tmp_path / "again.json"  # the kept answers score again through --hidden, by category
    assert main(["--head", str(run / "train" / "head"), "--model", str(model_dir), "--hidden", str(tmp_path / "answers" / "hidden"),
                 "--output", str(again)]) == 0
    assert json.loads(again.read_text()) == got


def test_prompt_files_and_bad_input(tmp_path, model_dir, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"turns": ["first", "second"], "category": "stem"}) + "\n" + json.dumps({"question": "q?"}) + "\n")
    (cat_a, a), (cat_b, b) = read_prompts(path)
    assert (cat_a, a.messages[0]["content"]) == ("stem", "first") and (cat_b, b.messages[0]["content"]) == ("p", "q?")
    assert main(["--head", str(tmp_path / "nowhere"), "--model", str(model_dir), "--prompts", str(path)]) == 2
    assert "nowhere" in capsys.readouterr().err
