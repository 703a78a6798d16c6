"""scripts/gpu_e2e/retrieval_on_device.sh in this machine's environment (SITE=-, --device cpu):
it serves the shipped retrieval model, asks retrieval_eval's questions and judges them against
the CPU records in benchmarks/records/retrieval, as it will on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from e2e.server import free_port

from sglang_dsv41.tools.serve import RETRIEVAL_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_script_serves_asks_and_compares(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "SITE": "-",
        "EXTRA_FLAGS": "--device cpu --sleep-on-idle",
        "SPEC": "1024:1",
        "REPLAY": "on",
        "PY": sys.executable,
        "MODEL": str(RETRIEVAL_DIR),
        "PORT": str(free_port()),
    }
    script = ROOT / "scripts" / "gpu_e2e" / "retrieval_on_device.sh"
    run = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    summary = (out / "summary.txt").read_text()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "replay on: server up" in summary, summary
    assert "overall 100.0% (5 prompts, raw)" in summary, summary
    assert "within 2 points at every length: yes (5 questions in common" in summary, summary
    assert summary.rstrip().endswith("replay on 1024: within 2 points"), summary
    assert (out / "compare_replay_on-1024.json").exists()
