"""retrieval_compare on random reports: the counts, the per-length differences and the verdict
must follow from the records, and reports of different tasks must not be compared."""

from __future__ import annotations

import json
import random

import pytest

from sglang_dsv41.tools import retrieval_compare

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def report(lengths, per_cell, answers, seed=0, form="raw") -> dict:
    """answers: (length, depth, index) -> reply text; the code is always 123456."""
    records = []
    for n in lengths:
        for d in DEPTHS:
            for k in range(per_cell):
                reply = answers(n, d, k)
                records.append(
                    {
                        "length": n,
                        "depth": d,
                        "index": k,
                        "code": "123456",
                        "reply": reply,
                        "answer": reply.strip()[:6],
                        "ok": reply.strip()[:6] == "123456",
                    }
                )
    return {"form": form, "filler": "docstrings", "facts": 4, "seed": seed, "records": records}


@pytest.mark.parametrize("trial", range(3))
def test_counts_follow_the_records(trial):
    rng = random.Random(trial)
    wrong_base = {(n, d, k) for n in (1024, 4096) for d in DEPTHS for k in range(4)}
    wrong_base = set(rng.sample(sorted(wrong_base), 5))
    wrong_new = set(rng.sample(sorted(wrong_base), 2)) | {(4096, 0.5, 3)}
    spaced = {(1024, 0.0, 1)}  # same answer, a different reply

    def base_reply(n, d, k):
        return "999999" if (n, d, k) in wrong_base else " 123456"

    def new_reply(n, d, k):
        if (n, d, k) in wrong_new:
            return "999999"
        return " 123456\n" if (n, d, k) in spaced else " 123456"

    base = report((1024, 4096), 4, base_reply)
    new = report((1024, 4096, 16384), 4, new_reply)
    cmp = retrieval_compare.compare([base], [new], points=2)
    assert cmp["shared"] == 40 and cmp["new_only"] == 20 and cmp["base_only"] == 0
    diffs = []
    for n in (1024, 4096):
        keys = [(n, d, k) for d in DEPTHS for k in range(4)]
        b_ok = sum(key not in wrong_base for key in keys)
        n_ok = sum(key not in wrong_new for key in keys)
        row = cmp["lengths"][str(n)]
        assert row["base"] == pytest.approx(100 * b_ok / 20)
        assert row["new"] == pytest.approx(100 * n_ok / 20)
        assert row["diff"] == pytest.approx(100 * (n_ok - b_ok) / 20)
        diffs.append(abs(n_ok - b_ok) * 5)
        answers = sum((key in wrong_base) != (key in wrong_new) for key in keys)
        assert row["answers_differ"] == answers
        assert row["replies_differ"] == answers + sum(
            key in spaced and key not in wrong_base | wrong_new for key in keys
        )
        for d in DEPTHS:
            cell = [(n, d, k) for k in range(4)]
            want = (
                100
                * (sum(c not in wrong_new for c in cell) - sum(c not in wrong_base for c in cell))
                / 4
            )
            assert row["depth_diff"][f"{d:g}"] == pytest.approx(want)
    assert cmp["within"] == (max(diffs) <= 2)
    assert "within 2 points" in retrieval_compare.format_comparison(cmp)


def test_verdict_at_the_threshold():
    base = report((1024,), 20, lambda n, d, k: " 123456")  # 100 questions
    one_wrong = report((1024,), 20, lambda n, d, k: "000000" if (d, k) == (0.5, 0) else " 123456")
    three_wrong = report((1024,), 20, lambda n, d, k: "000000" if k < 3 and d == 1 else " 123456")
    assert retrieval_compare.compare([base], [one_wrong], 2)["within"]
    cmp = retrieval_compare.compare([base], [three_wrong], 2)
    assert not cmp["within"] and cmp["lengths"]["1024"]["diff"] == -3.0
    assert cmp["lengths"]["1024"]["worst_depth"] == "1"


def test_different_tasks_share_no_question(tmp_path):
    a = report((1024,), 2, lambda n, d, k: " 123456", seed=0)
    b = report((1024,), 2, lambda n, d, k: " 123456", seed=1)
    with pytest.raises(ValueError, match="no question in common"):
        retrieval_compare.compare([a], [b])
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert retrieval_compare.main(["--base", str(pa), "--new", str(pb)]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"records": []}))
    assert retrieval_compare.main(["--base", str(bad), "--new", str(pb)]) == 2


def test_command_line_writes_json(tmp_path):
    a = report((1024, 4096), 2, lambda n, d, k: " 123456")
    b = report((4096,), 2, lambda n, d, k: "111111" if d == 0 else " 123456")
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cmp.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert retrieval_compare.main(["--base", str(pa), "--new", str(pb), "--json", str(out)]) == 1
    cmp = json.loads(out.read_text())
    assert list(cmp["lengths"]) == ["4096"] and cmp["lengths"]["4096"]["diff"] == -20.0
    assert cmp["base_only"] == 10
