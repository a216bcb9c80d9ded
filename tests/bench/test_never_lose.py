"""The never-lose report reads bench runs: fixed k's against adaptive at batch 1, adaptive
against plain at larger batches, with the pass marks the README's table shows."""

from __future__ import annotations

import json

from speculant.bench.never_lose import (
    batch1_rows,
    batched_rows,
    load_runs,
    main,
    markdown,
    parse_method,
)


def _row(method, batch, category, speedup, tok_s=10.0, tau=1.5):
    return {"method": method, "batch": batch, "category": category, "speedup": speedup, "tok_s": tok_s,
            "throughput_tok_s": tok_s, "tau": tau, "same_tokens": True}


def _write(folder, name, batch_sizes, categories, rows):
    (folder / name).mkdir(parents=True)
    setup = {"batch_sizes": batch_sizes, "categories": categories}
    (folder / name / "bench.json").write_text(json.dumps({"setup": setup, "rows": rows}))


def test_parse_method():
    assert parse_method("none") is None
    assert parse_method("ngram:k=4:adaptive_k=false") == ("ngram", 4, False)
    assert parse_method("draft:k=6:adaptive_k=true") == ("draft", 6, True)


def test_report_marks_what_passes(tmp_path, capsys):
    _write(tmp_path, "b1", [1], None, [
        _row("none", 1, "chat", 1.0), _row("ngram:k=2:adaptive_k=false", 1, "chat", 1.10),
        _row("ngram:k=4:adaptive_k=false", 1, "chat", 1.20), _row("ngram:k=8:adaptive_k=true", 1, "chat", 1.16),
        _row("none", 1, "math", 1.0), _row("ngram:k=2:adaptive_k=false", 1, "math", 1.30),
        _row("ngram:k=4:adaptive_k=false", 1, "math", 1.10), _row("ngram:k=8:adaptive_k=true", 1, "math", 1.20),
    ])
    _write(tmp_path, "b16", [16], ["chat"], [
        _row("none", 16, "all", 1.0, tok_s=200.0), _row("ngram:k=8:adaptive_k=true", 16, "all", 0.97, tok_s=194.0),
    ])
    runs = load_runs(tmp_path)
    b1 = {r["category"]: r for r in batch1_rows(runs)}
    assert b1["chat"]["best_k"] == 4 and abs(b1["chat"]["vs_best"] - 1.16 / 1.20) < 1e-9  # 0.967: within 5%
    assert b1["math"]["best_k"] == 2 and b1["math"]["vs_best"] < 0.95
    (b16,) = batched_rows(runs)
    assert (b16["batch"], b16["category"], round(b16["ratio"], 2)) == (16, "chat", 0.97)
    table = markdown(list(b1.values()), [b16])
    assert "| ngram | chat | 10.0 | 1.10x | 1.20x | **1.16x** (k ≤ 8) | 1.50 | ✓ |" in table
    assert "| ngram | math |" in table and table.count("✗") == 2  # math vs best fixed, and batch 16 below 0.98x
    main([str(tmp_path)])
    assert (tmp_path / "never_lose.png").stat().st_size > 1000
    assert capsys.readouterr().out.startswith("| method | category |")


def test_a_batch_1_run_without_fixed_k_is_held_to_plain_decoding_only(tmp_path):
    _write(tmp_path, "b1_long", [1], ["qa"], [_row("none", 1, "qa", 1.0), _row("draft:k=6", 1, "qa", 0.99)])
    (row,) = [r for r in batch1_rows(load_runs(tmp_path)) if r["category"] == "qa"]
    assert row["best_k"] is None and row["vs_best"] is None
    assert "| draft | qa | 10.0 |  | **0.99x** (k ≤ 6) | 1.50 | ✓ | – | b1_long |" in markdown([row], [])
    main([str(tmp_path)])
