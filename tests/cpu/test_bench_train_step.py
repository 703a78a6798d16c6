"""benchmarks/bench_train_step.py: one timed step per stage after a warm-up, the op count of one
sequence matching a count taken here, and a clear refusal of unknown stages."""

import collections
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_train_step  # noqa: E402


def test_one_stage_reports_times_and_the_op_count(tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["--batch", "1", "--steps", "2", "--stages", "recall", "--json", str(out)]
    assert bench_train_step.main(argv) == 0
    rep = json.loads(out.read_text())
    (row,) = rep["stages"]
    assert row["stage"] == "recall" and row["step_s"] > 0 and row["tokens_per_step"] > 0
    assert sum(row["top_ops"].values()) <= row["ops_per_sequence"]
    assert "recall" in capsys.readouterr().out


def test_the_op_counter_counts_what_runs():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with bench_train_step.OpCount() as count:
        (a @ b).relu().sum()
    assert count.ops == collections.Counter({"aten.mm": 1, "aten.relu": 1, "aten.sum": 1})


def test_unknown_stage_is_refused():
    with pytest.raises(SystemExit):
        bench_train_step.main(["--stages", "recall,warmup"])
