"""The GPU end-to-end client's verdicts (scripts/gpu_e2e/verdicts.py): equal, near-tie, past the
rounding horizon (where the fp32 and fp64 oracles already disagree), or differs."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("verdicts", ROOT / "scripts/gpu_e2e/verdicts.py")
v = importlib.util.module_from_spec(spec)
spec.loader.exec_module(v)


def steps(tokens, margin=1.0, logprob=-1.0):
    return [{"token": t, "logprob": logprob, "margin": margin} for t in tokens]


def test_equal_near_tie_and_differs():
    ref = steps([1, 2, 3, 4])
    assert v.judge([1, 2, 3, 4], ref) == ("equal", None, None)
    tie = steps([1, 2, 3, 4], margin=0.01)
    assert v.judge([1, 2, 9, 9], tie)[0] == "near_tie"
    assert v.judge([1, 2, 9, 9], ref) == ("differs", 2, 1.0)
    assert v.judge([1, 2], ref)[0] == "differs"  # a short answer is never equal


def test_rounding_horizon():
    ref = steps([1, 2, 3, 4])
    ref64 = steps([1, 2, 7, 8])  # the oracles part at step 2
    assert v.horizon(ref, [ref64]) == 2
    assert v.horizon(ref, []) == 4
    assert v.judge([1, 2, 5, 5], ref, [ref64])[0] == "rounding"  # at the horizon
    assert v.judge([1, 5, 5, 5], ref, [ref64])[0] == "differs"  # before it
    assert v.judge([1, 2, 7, 8], ref, [ref64])[0] == "rounding"  # the fp64 oracle's answer
    assert v.judge([1, 5, 7, 8], ref, [ref64], follows=False)[0] == "differs"
    drift = steps([1, 2, 3, 4])
    drift[1]["logprob"] = -1.5  # same tokens, logprobs apart from step 1
    assert v.horizon(ref, [drift]) == 1
    early = steps([1, 9, 9, 9])  # a second variant parts earlier: the earliest counts
    assert v.horizon(ref, [ref64, early]) == 1
    assert v.judge([1, 5, 5, 5], ref, [ref64, early])[0] == "rounding"


def test_logprob_error_reads_the_oracle_tokens():
    ref = steps([1, 2])
    served = [[[-1.001, 1, None], [-3.0, 2, None]], [[-0.999, 2, None]]]
    assert abs(v.logprob_error(served, ref, 2) - 0.001) < 1e-12
    assert v.logprob_error(served, ref, 0) == 0.0
    assert v.logprob_error([[[-1.0, 5, None]]], ref, 1) == float("inf")


def test_rounding_probe_counts_the_prompts_whose_oracles_part(tmp_path):
    import json
    import subprocess
    import sys

    a, b = steps([1, 2, 3]), steps([1, 2, 3])
    c = steps([1, 2, 3])
    c[1]["logprob"] = -1.5  # parts at step 1 by 0.5
    ref = {"replay": [a, a], "replay64": [b, c], "full": [a], "full64": [b]}
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(ref))
    probe = ROOT / "scripts/gpu_e2e/rounding_probe.py"
    out = subprocess.run(
        [sys.executable, str(probe), "count", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "replay: 1 / 2 prompts part" in out and "gap before a token differs 0.5" in out
    assert "full: 0 / 1 prompts part" in out
