"""model_eval: retrieval_eval's questions answered in process equal the oracle's greedy answers,
and train.py's in-process check, snapshots and time limit work on a short run."""

from __future__ import annotations

import json
import random

import pytest
import torch

from sglang_dsv41.reference.model import load_reference
from sglang_dsv41.tools import retrieval_eval
from sglang_dsv41.training import model_eval, train
from sglang_dsv41.training.examples import encode_example
from sglang_dsv41.training.task import CODE_DIGITS, first_code

RETRIEVAL = "sglang_dsv41/data/retrieval"


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    return load_reference(RETRIEVAL), model_eval.load_task_tokenizer(RETRIEVAL)


def test_documents_are_retrieval_evals(shipped):
    """The in-process questions are the server tool's: same flags, same documents."""
    _, tt = shipped
    args = model_eval.eval_args(lengths=[300, 700], per_cell=2, seed=5)
    docs = retrieval_eval.eval_documents(args, tt.count)
    assert [(n, d, k) for n, d, k, _ in docs] == [
        (n, d, k) for n in (300, 700) for d in retrieval_eval.DEPTHS for k in range(2)
    ]
    rng = random.Random("eval:5:700:0.5:1")
    again = retrieval_eval.make_document(
        rng, retrieval_eval.filler_lines(args.filler), 700, tt.count, 4, depth=0.5, split="eval"
    )
    assert next(doc for n, d, k, doc in docs if (n, d, k) == (700, 0.5, 1)).lines == again.lines


@pytest.mark.parametrize("replay", [True, False])
def test_teacher_forced_answer_equals_the_oracles_greedy_answer(shipped, replay):
    """ok exactly when the oracle's greedy continuation starts with the code (a perturbed model
    answers wrong: both sides must agree on that too)."""
    model, tt = shipped
    noisy = load_reference(RETRIEVAL)
    with torch.no_grad():
        g = torch.Generator().manual_seed(11)
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1.0 * p.std().nan_to_num(0.0))
    args = model_eval.eval_args(lengths=[256, 600], per_cell=1, seed=2)
    outcomes = set()
    for m in (model, noisy):
        for _, _, _, doc in retrieval_eval.eval_documents(args, tt.count):
            ok, _, nll = model_eval.answer_ok(m, tt, doc, replay, "cpu")
            assert ok or nll > 0.69  # a wrong digit had p < 1/2
            ex = encode_example(tt, doc, "raw")
            greedy = m.generate(ex.ids[: ex.prompt_len], CODE_DIGITS, replay=replay)
            assert ok == (greedy == ex.targets[:CODE_DIGITS])
            assert ok == (first_code(tt.tok.decode(greedy)) == doc.code)
            outcomes.add(ok)
    assert outcomes == {True, False}, "the check saw only one outcome"


def test_report_has_retrieval_evals_shape(shipped):
    model, tt = shipped
    args = model_eval.eval_args(lengths=[256], per_cell=1, depths=[0.0, 1.0])
    rep = model_eval.evaluate_model(model, tt, args)
    assert set(rep["accuracy"]["256"]) == {"0", "1", "all"}
    assert len(rep["records"]) == 2 and rep["replay"] is True
    assert rep["mean_nll"] == sum(r["nll"] for r in rep["records"]) / 2
    assert "256 |" in retrieval_eval.format_table(rep)
    with pytest.raises(TypeError, match="unknown"):
        model_eval.eval_args(lenghts=[1])
    with pytest.raises(SystemExit):  # a usage error, not a traceback
        model_eval.parse_args(["--model", "/nonexistent"])


def test_eval_spec_parsing():
    assert train.parse_eval_spec("1024:20,16384:4,512") == [(1024, 20), (16384, 4), (512, 4)]
    for bad in ("1k:2", "1024:0", "8:1"):
        with pytest.raises(ValueError, match="--eval-spec"):
            train.parse_eval_spec(bad)
    with pytest.raises(SystemExit):  # a usage error on the command line, not a traceback
        train.parse_args(["--out", "x", "--eval-spec", "1k:2"])


def test_train_checks_snapshots_and_stops_at_the_time_limit(tmp_path):
    """Two steps of the tiny curriculum: a check and a snapshot each step, then the time limit
    (0 s: stop after the first step) leaves state and checkpoint at the step it stopped."""
    log = tmp_path / "log.jsonl"
    argv = [
        "--out",
        str(tmp_path / "ckpt"),
        "--state",
        str(tmp_path / "state.pt"),
        "--log",
        str(log),
        "--preset",
        "tiny",
        "--scale",
        "0.002",
        "--batch",
        "1",
        "--eval-every",
        "1",
        "--eval-spec",
        "128:1",
        "--snapshots",
        str(tmp_path / "snaps"),
        "--save-every",
        "100",
        "--probe-every",
        "1000",
    ]
    assert train.main([*argv, "--time-limit", "0"]) == 0
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert recs[-1] == {"stopped": 1, "time_limit": 0.0}
    assert set(recs[-2]["eval"]) == {"128", "min", "nll"} and 0.0 <= recs[-2]["eval"]["min"] <= 1.0
    assert torch.load(tmp_path / "state.pt")["step"] == 1
    assert (tmp_path / "snaps" / "step-00001" / "model.safetensors").is_file()
    assert train.main(argv + ["--stop-after", "2"]) == 0  # resumes from the saved state
    steps = [r["step"] for r in map(json.loads, log.read_text().splitlines()) if "step" in r]
    assert steps == [1, 2]
    assert (tmp_path / "snaps" / "step-00002").is_dir()


def test_needle_recall_reports_the_pool_and_the_top_k(tmp_path):
    """needle_recall on the shipped model: the oracle's pool and top-k at the answer row."""
    from sglang_dsv41.training import needle_recall

    out = tmp_path / "needle.json"
    argv = ["--model", RETRIEVAL, "--lengths", "300", "--per-length", "2", "--json", str(out)]
    assert needle_recall.main(argv) == 0
    rep = json.loads(out.read_text())
    row = rep["table"]["300"]
    assert {"pool", "first", "topk[6]", "topk[8]", "topk[10]"} <= set(row)
    assert row["pool"] == 1.0 and row["first"] == 1.0 and len(rep["records"]) == 2


def test_recall_report_asks_the_needle_question(tmp_path):
    """recall_report --needle on the shipped model gives needle_recall's records; bad lengths
    are refused with a message."""
    from sglang_dsv41.tools import recall_report

    out = tmp_path / "needle.json"
    argv = ["--model", RETRIEVAL, "--needle", "300", "--per-length", "1", "--json", str(out)]
    assert recall_report.main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["table"]["300"]["pool"] == 1.0 and len(rep["records"]) == 1
    assert rep["records"][0]["depth"] == 0.0
    for bad in ("3x", "32"):
        with pytest.raises(SystemExit, match="needle lengths"):
            recall_report.main(["--model", RETRIEVAL, "--needle", bad])
