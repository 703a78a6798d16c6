"""The GPU node check's verdict logic, and its plumbing on a machine without GPUs."""

import torch

from sglang_dsv41.tools import node_check


def test_judge_equal_near_tie_diverged():
    lp = torch.log_softmax(torch.tensor([[2.0, 1.9, -3.0], [0.0, 5.0, 0.0]]).double(), -1)
    assert node_check.judge([0, 1], list(lp), [0, 1]) == ("equal", None, 0.0)
    kind, step, margin = node_check.judge([0, 1], list(lp), [1, 1])
    assert (kind, step) == ("near-tie", 0) and abs(margin - 0.1) < 1e-6
    kind, step, margin = node_check.judge([0, 1], list(lp), [0, 2])
    assert (kind, step) == ("diverged", 1) and margin > node_check.TOL_NATS
    assert node_check.judge([0, 1], list(lp), [0])[0] == "diverged"


def test_prompts_are_fixed():
    a, b = node_check.prompts(512), node_check.prompts(512)
    assert a == b and [len(p) for p in a] == list(node_check.PROMPT_LENS)
    assert all(2 <= t < 512 for p in a for t in p)


def test_without_gpus_nothing_is_served(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(node_check, "gpu_count", lambda: 0)
    rc = node_check.main(["--work", str(tmp_path), "--tp", "1,2"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 2
    assert out.startswith("gpu_node_check: FAIL") and "tp=1 skipped (0 GPUs)" in out, out
