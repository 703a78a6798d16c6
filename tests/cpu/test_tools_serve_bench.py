"""benchmarks/serve_bench.py against a tiny CPU server on loopback: a two-point sweep writes the
JSON, the markdown table and both PNGs with figures from bench_serving; a prompt file drives the
same sweep; --compare puts two runs side by side with their ratios."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.server import Server

from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "serve_bench.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("tiny")
    assert make_checkpoint(["--preset", "tiny", "--out", str(ckpt), "--force"]) == 0
    # one torch thread: the 2-core CI machine runs the tests beside the server
    srv = Server(str(ckpt), str(ckpt / "server.log"), env={"OMP_NUM_THREADS": "1"})
    yield srv
    srv.stop()


def _bench(*args, timeout=600):
    r = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _png(path: Path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path


def test_sweep_and_compare(server, tmp_path):
    out = tmp_path / "a"
    sweep = ["--url", server.url, "--concurrency", "1,2", "--input-len", "24", "--rounds", "1"]
    r = _bench(*sweep, "--output-len", "3", "--min-prompts", "2", "--label", "A", "--out", str(out))
    assert "serve_bench" in r.stderr  # the progress bar
    run = json.loads((out / "serve_bench.json").read_text())
    assert [p["max_concurrency"] for p in run["points"]] == [1, 2]
    for p in run["points"]:
        assert p["completed"] == max(p["max_concurrency"], 2)
        assert p["output_throughput"] > 0 and p["median_ttft_ms"] > 0
        assert p["p99_ttft_ms"] >= p["median_ttft_ms"] and p["median_tpot_ms"] > 0
    assert run["model_info"]["model_type"] == "deepseek_v41" and run["source"] == "random token ids"
    assert run["server_args"]["device"] == "cpu"
    md = (out / "serve_bench.md").read_text()
    assert md.count("\n| 1 | 24 | 3 |") == 1 and "| 2 | 24 | 3 |" in md
    _png(out / "throughput.png")
    _png(out / "latency.png")

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox.\n\nA second paragraph of text, longer than the first.")
    out_b = tmp_path / "b"
    one = ["--url", server.url, "--concurrency", "1", "--input-len", "24", "--output-len", "3"]
    one += ["--rounds", "1"]
    _bench(
        *one, "--min-prompts", "3", "--prompts", str(prompts), "--label", "B", "--out", str(out_b)
    )
    run_b = json.loads((out_b / "serve_bench.json").read_text())
    assert run_b["source"].startswith("prompts file") and len(run_b["points"]) == 1
    assert run_b["points"][0]["completed"] == 3  # 2 paragraphs cycled to 3 requests

    cmp_dir = tmp_path / "cmp"
    _bench("--compare", str(out / "serve_bench.json"), str(out_b / "serve_bench.json"),
           "--out", str(cmp_dir))  # fmt: skip
    table = (cmp_dir / "compare.md").read_text()
    a1 = run["points"][0]["output_throughput"]
    b1 = run_b["points"][0]["output_throughput"]
    assert f"| 24 | 3 | 1 | output_throughput | {a1:.2f} | {b1:.2f} | {b1 / a1:.2f} |" in table
    _png(cmp_dir / "compare.png")


def test_bad_url_fails_loudly(tmp_path):
    r = subprocess.run(
        [sys.executable, str(BENCH), "--url", "http://127.0.0.1:9", "--concurrency", "1",
         "--input-len", "8", "--output-len", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0 and "no SGLang server answers" in (r.stdout + r.stderr)
