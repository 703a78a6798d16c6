"""The head-to-head table: this package against stock SGLang's own V4.1 on one checkpoint and one
GPU, both servers measured in one call.

    python benchmarks/head_to_head.py --model-path SLICE [--profile marlin] [--out DIR]
        [--concurrency 1,16,64] [--input-len 1024,8192,32768] [--output-len 64] [--rounds 1]
        [--budget-s 540] [--side ours=ours --side stock=stock]
    python benchmarks/head_to_head.py --render DIR/head_to_head.json [--out DIR]

For each side in turn (`sglang_dsv41.tools.head_to_head`: the same flags, the plugin left out of
stock's launch): start the server, read its log (max_total_num_tokens, bytes per token of
context = KV pool bytes / max_total_num_tokens, the longest context it admits = min(context
length, max_total_num_tokens)), run `benchmarks/serve_bench.py`'s bench_serving points (random
token ids, exact lengths, ignore_eos; requests per point = concurrency x rounds, at least 4)
from the cheapest to the dearest while nvidia-smi's memory.used is sampled every 0.5 s (peak GPU
memory), then stop it. Each side gets half of --budget-s; a point that would not fit in what is
left is skipped and listed as such. `--side LABEL=SIDE[:EXTRA ARGS]` renames a side or adds
launch arguments (two settings of ours on CPU prove the plumbing: `--side a=ours --side
b=ours:--no-enable-decoder-swa-bounded-replay --device cpu` with `--profile native`, the
first side given `:--device cpu` too).

Writes head_to_head.json (everything), head_to_head.md (the table, stock / ours ratios) and
head_to_head.png (KV capacity, output tok/s, TTFT and TPOT against concurrency per input length).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_bench  # noqa: E402

from sglang_dsv41.tools import agreement  # noqa: E402
from sglang_dsv41.tools.head_to_head import PROFILES, Server, Settings, parse_log  # noqa: E402

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
LOG_KEYS = ("max_total_num_tokens", "kv_bytes_per_token", "longest_context", "weights_gib")


class PeakMemory:
    """Highest nvidia-smi memory.used (MiB) of GPU 0 while running; None without nvidia-smi."""

    def __init__(self, period: float = 0.5):
        self.peak, self.period, self._stop = None, period, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
        while not self._stop.is_set():
            try:
                used = int(subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout)
                self.peak = used if self.peak is None else max(self.peak, used)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return
            self._stop.wait(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)


def parse_side(text: str) -> tuple:
    """'LABEL=SIDE[:EXTRA ARGS]' -> (label, side, [extra args])."""
    label, _, rest = text.partition("=")
    side, _, extra = rest.partition(":")
    if not label or side not in ("ours", "stock"):
        raise argparse.ArgumentTypeError(f"--side LABEL=ours|stock[:ARGS], got {text!r}")
    return label, side, shlex.split(extra)


def grid(args) -> list:
    """(input, output, concurrency) points, cheapest (fewest tokens in flight) first."""
    pts = [(i, o, c) for i in args.input_len for o in args.output_len for c in args.concurrency]
    return sorted(pts, key=lambda p: (p[0] + p[1]) * max(p[2] * args.rounds, args.min_prompts))


def run_side(label: str, side: str, extra: list, args, settings, deadline: float) -> dict:
    work = Path(args.work) / label
    work.mkdir(parents=True, exist_ok=True)
    row = {"label": label, "side": side, "points": [], "skipped": []}
    agree = Path(args.agreement) if args.agreement else None
    env = agreement.census_env(side, agree) if agree else None
    with (
        PeakMemory() as peak,
        Server(side, args.model_path, work / "server.log", settings, extra, env) as srv,
    ):
        row["command"] = srv.command
        row["ready_s"] = srv.wait_ready(max(60.0, deadline - time.time()))
        row["log"] = parse_log(srv.log.read_text(errors="replace"))
        if agree is not None:  # the agreement run on the same server, before the load points
            t0 = time.time()
            try:
                agreement.serve_side(srv.url, side, agree)
                print(f"{label}: agreement continuations in {time.time() - t0:.0f} s", flush=True)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                print(f"{label}: agreement FAILED: {str(e)[-2000:]}", flush=True)
        bench = SimpleNamespace(
            url=srv.url,
            tokenizer=args.tokenizer or args.model_path,
            seed=args.seed,
            rounds=args.rounds,
            min_prompts=args.min_prompts,
            timeout=args.point_timeout,
        )
        log = work / "bench_serving.log"
        for inp, outp, conc in grid(args):
            left = deadline - time.time()
            if left < 30:
                row["skipped"].append([inp, outp, conc])
                continue
            point = serve_bench.run_point(bench, conc, inp, outp, log, timeout=left - 10)
            if point is None:
                row["skipped"].append([inp, outp, conc])
                continue
            row["points"].append(point)
            print(
                f"{label}: in {inp} out {outp} conc {conc}: "
                f"{point['output_throughput']:.1f} tok/s, TPOT {point['median_tpot_ms']:.2f} ms",
                flush=True,
            )
        row["log"] = parse_log(srv.log.read_text(errors="replace"))
    row["peak_gpu_mib"] = peak.peak
    return row


def ratio(a, b):
    return b / a if a and b is not None else None


def markdown(result: dict) -> str:
    sides = result["sides"]
    b = sides[1] if len(sides) > 1 else None
    names = [s["label"] for s in sides]
    head = f"| | {' | '.join(names)} |" + (f" {names[1]} / {names[0]} |" if b else "")
    lines = [head, "|---" * (len(names) + 1 + bool(b)) + "|"]
    for key in LOG_KEYS + ("peak_gpu_mib", "ready_s"):
        vals = [s.get(key, s["log"].get(key)) for s in sides]
        cells = [
            f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if v is not None else "-"
            for v in vals
        ]
        r = ratio(vals[0], vals[1]) if b else None
        lines.append(
            f"| {key} | " + " | ".join(cells) + (f" | {r:.2f} |" if r else " | - |" if b else " |")
        )
    lines += [
        "",
        "| in | out | conc | metric | "
        + " | ".join(names)
        + (f" | {names[1]} / {names[0]} |" if b else " |"),
        "|---" * (4 + len(names) + bool(b)) + "|",
    ]
    keyed = [
        {(p["input_len"], p["output_len"], p["max_concurrency"]): p for p in s["points"]}
        for s in sides
    ]
    for shape in sorted(set().union(*keyed)):
        for m in METRICS:
            vals = [k.get(shape, {}).get(m) for k in keyed]
            cells = [f"{v:.2f}" if v is not None else "skipped" for v in vals]
            r = ratio(vals[0], vals[1]) if b else None
            lines.append(
                f"| {shape[0]} | {shape[1]} | {shape[2]} | {m} | "
                + " | ".join(cells)
                + (f" | {r:.2f} |" if r else " | - |" if b else " |")
            )
    return "\n".join(lines) + "\n"


def plot(result: dict, png: Path) -> None:
    plt = serve_bench._pyplot()
    sides = result["sides"]
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
    labels = [s["label"] for s in sides]
    toks = [s["log"].get("max_total_num_tokens") or 0 for s in sides]
    axes[0].bar(labels, toks, color=[f"C{j}" for j in range(len(sides))])
    axes[0].set_title("KV capacity (max_total_num_tokens)", fontsize=10)
    for j, s in enumerate(sides):
        run = {"points": s["points"]}
        for k, shape in enumerate(serve_bench._shapes(run)):
            mk = "osv^"[k % 4]
            for ax, key in zip(
                axes[1:], ("output_throughput", "median_ttft_ms", "median_tpot_ms"), strict=True
            ):
                x, y = serve_bench._curve(run, shape, key)
                ax.plot(x, y, "-", marker=mk, color=f"C{j}", label=f"{s['label']} in {shape[0]}")
    ticks = sorted({p["max_concurrency"] for s in sides for p in s["points"]})
    serve_bench._axes_style(axes[1], "output tokens/s", "tokens/s", ticks=ticks)
    serve_bench._axes_style(axes[2], "TTFT p50", "ms", log_y=True, ticks=ticks)
    serve_bench._axes_style(axes[3], "TPOT p50", "ms", log_y=True, ticks=ticks)
    serve_bench._save(plt, fig, " vs ".join(labels) + f" ({result.get('profile')})", png)


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "head_to_head.json").write_text(json.dumps(result, indent=1))
    (out / "head_to_head.md").write_text(markdown(result))
    plot(result, out / "head_to_head.png")
    print(markdown(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-path")
    ap.add_argument("--render", help="a head_to_head.json to render again")
    ap.add_argument("--side", type=parse_side, action="append")
    ap.add_argument("--profile", choices=sorted(PROFILES), default=Settings.profile)
    ap.add_argument("--mem-fraction-static", type=float, default=Settings.mem_fraction_static)
    ap.add_argument("--context-length", type=int, default=Settings.context_length)
    ap.add_argument("--chunked-prefill-size", type=int, default=Settings.chunked_prefill_size)
    ap.add_argument("--max-running-requests", type=int, default=Settings.max_running_requests)
    ap.add_argument("--concurrency", type=serve_bench._ints, default=[1, 16, 64])
    ap.add_argument("--input-len", type=serve_bench._ints, default=[1024, 8192, 32768])
    ap.add_argument("--output-len", type=serve_bench._ints, default=[64])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--min-prompts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--point-timeout", type=float, default=300)
    ap.add_argument("--work", default="/tmp/h2h_bench")
    ap.add_argument("--out", default="head_to_head_out")
    ap.add_argument(
        "--agreement",
        metavar="DIR",
        help="also run tools.agreement's continuations on each server before its points "
        "(stock first; DIR as agreement's --work; then `agreement judge --work DIR`)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.render:
        write(json.loads(Path(args.render).read_text()), out)
        return 0
    if not args.model_path:
        ap.error("--model-path or --render is required")
    settings = Settings(
        mem_fraction_static=args.mem_fraction_static,
        context_length=args.context_length,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        profile=args.profile,
    )
    sides = args.side or [("ours", "ours", []), ("stock", "stock", [])]
    if args.agreement:
        agreement.write_prompts(args.model_path, Path(args.agreement))
        sides = sorted(sides, key=lambda s: s[1] != "stock")  # ours scores stock's continuations
    t0 = time.time()
    result = {
        "profile": args.profile,
        "settings": vars(settings),
        "model_path": args.model_path,
        "commit": serve_bench._commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv),
        "sides": [],
    }
    note = Path(args.model_path) / "flash_slice.json"
    result["slice"] = json.loads(note.read_text()) if note.exists() else None
    for j, (label, side, extra) in enumerate(sides):
        share = (args.budget_s - (time.time() - t0)) / (len(sides) - j)
        try:
            result["sides"].append(
                run_side(label, side, extra, args, settings, time.time() + share)
            )
        except RuntimeError as e:
            print(f"{label}: {e}", flush=True)
            result["sides"].append(
                {
                    "label": label,
                    "side": side,
                    "error": str(e)[-2000:],
                    "points": [],
                    "skipped": [],
                    "log": {},
                }
            )
    write(result, out)
    return 0 if all(s["points"] for s in result["sides"]) else 1


if __name__ == "__main__":
    sys.exit(main())
