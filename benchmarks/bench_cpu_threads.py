"""The served model's CPU threads: torch's default against the plugin's (one thread for models
narrower than 1024), side by side in one run, under the same competing CPU load.

    python benchmarks/bench_cpu_threads.py [--load-procs 2] [--preset tiny]

Makes the checkpoint in a temporary directory, starts `--load-procs` busy-looping processes
(the competing load), then for each configuration starts `sglang.launch_server --device cpu` on
loopback and runs `python -m sglang.bench_serving --backend sglang --dataset-name random-ids`
(offline: random token ids, the checkpoint's tokenizer) at concurrency 1 and 8, and stops it.
Configurations: DSV41_CPU_THREADS=0 (torch's default: one thread per core, the old behaviour)
and the plugin's default. Prints a markdown table and one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CONFIGS = (
    ("torch default (DSV41_CPU_THREADS=0)", {"DSV41_CPU_THREADS": "0"}),
    ("plugin default", {}),
)
RUNS = ((1, 8), (8, 24))  # (concurrency, prompts)
INPUT_LEN, OUTPUT_LEN = 128, 16


def _busy() -> None:
    while True:
        pass


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(ckpt: str, env: dict, log_path: str):
    port = _port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", ckpt, "--device", "cpu"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--sleep-on-idle"]
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
    )
    deadline = time.time() + 900
    while time.time() < deadline:
        assert proc.poll() is None, open(log_path).read()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200 and "fired up" in open(log_path).read():
                    return proc, port
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(log_path)


def _bench(ckpt: str, port: int, concurrency: int, prompts: int, out: str) -> dict:
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dataset-name", "random-ids"]
    cmd += ["--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN)]
    cmd += ["--random-range-ratio", "1.0", "--tokenizer", ckpt, "--num-prompts", str(prompts)]
    cmd += ["--max-concurrency", str(concurrency), "--output-file", out, "--disable-tqdm"]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    with open(out) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--load-procs", type=int, default=2)
    args = ap.parse_args()
    from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, args.preset)
        make_checkpoint(["--preset", args.preset, "--out", ckpt])
        load = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load_procs)]
        for p in load:
            p.start()
        try:
            for name, env in CONFIGS:
                proc, port = _serve(ckpt, env, os.path.join(tmp, "server.log"))
                try:
                    with open(os.path.join(tmp, "server.log")) as f:
                        threads = [ln for ln in f if "torch CPU thread" in ln]
                    for conc, n in RUNS:
                        r = _bench(ckpt, port, conc, n, os.path.join(tmp, f"{conc}.jsonl"))
                        row = {
                            "config": name,
                            "threads_log": threads[-1].strip()[-60:] if threads else "",
                            "concurrency": conc,
                            "prompts": n,
                            "req_s": r["request_throughput"],
                            "out_tok_s": r["output_throughput"],
                            "median_ttft_ms": r["median_ttft_ms"],
                            "mean_tpot_ms": r["mean_tpot_ms"],
                            "mean_e2e_ms": r["mean_e2e_latency_ms"],
                            "loadavg": os.getloadavg()[0],
                        }
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                finally:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=60)
        finally:
            for p in load:
                p.terminate()
    print(
        "| configuration | concurrency | prompts | req/s | output tok/s | median TTFT | "
        "mean TPOT | mean E2E | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['concurrency']} | {r['prompts']} | {r['req_s']:.2f} | "
            f"{r['out_tok_s']:.1f} | {r['median_ttft_ms']:.0f} ms | {r['mean_tpot_ms']:.0f} ms | "
            f"{r['mean_e2e_ms']:.0f} ms | {r['loadavg']:.1f} |"
        )


if __name__ == "__main__":
    main()
