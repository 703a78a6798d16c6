"""Serving benchmark against any running server: a concurrency x length sweep of SGLang's
`bench_serving`, written as JSON, a markdown table and PNG plots; or two runs side by side.

    python benchmarks/serve_bench.py --url http://127.0.0.1:30000 [--concurrency 1,2,4,8]
        [--input-len 128,1024] [--output-len 64] [--rounds 4] [--prompts FILE]
        [--tokenizer DIR] [--label TEXT] [--out DIR]
    python benchmarks/serve_bench.py --compare A/serve_bench.json B/serve_bench.json [--out DIR]

Each point runs `python -m sglang.benchmark.serving` (what `sglang.bench_serving` became in
0.5.23) with `--backend sglang --dataset-name random-ids --tokenize-prompt`: random token ids,
exact input lengths, `ignore_eos` so every request produces exactly the output length, no
dataset download. With --prompts FILE the ids come from that text instead (its paragraphs,
tokenized, repeated or cut to the input length: bench_serving's `random` dataset over a
ShareGPT-shaped file written into --out). Requests per point: concurrency x rounds (at least
--min-prompts), all sent at once (`--request-rate inf`) and capped at the concurrency, after
one warm-up request. A progress bar runs over the points.

Writes into --out (default serve_bench_out/): serve_bench.json (the points, the server's
/model_info and /server_info, the command, commit and --label), serve_bench.md, throughput.png
(output tokens/s against concurrency) and latency.png (TTFT and TPOT p50 / p90 / p99).
--compare writes compare.md and compare.png for two such JSON files (for example this package
against SGLang's in-tree V4.1 on one node, or decoder replay on against off).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

KEYS = (
    "completed",
    "duration",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
)
COLUMNS = (  # markdown: header, key, format
    ("conc", "max_concurrency", "{:d}"),
    ("in", "input_len", "{:d}"),
    ("out", "output_len", "{:d}"),
    ("reqs", "completed", "{:d}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("total tok/s", "total_throughput", "{:.1f}"),
    ("TTFT p50 ms", "median_ttft_ms", "{:.0f}"),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.0f}"),
    ("TPOT p50 ms", "median_tpot_ms", "{:.1f}"),
    ("TPOT p99 ms", "p99_tpot_ms", "{:.1f}"),
)


def _ints(text: str) -> list:
    vals = [int(v) for v in text.split(",") if v.strip()]
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"positive comma-separated integers, got {text!r}")
    return vals


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read().decode())
    except (OSError, ValueError):
        return None


def sharegpt_file(prompts: Path, out: Path, count: int) -> Path:
    """A ShareGPT-shaped JSON of the prompt file's paragraphs, cycled to at least `count` rows
    (bench_serving sends one request per row and stops early when rows run out)."""
    paras = [p.strip() for p in prompts.read_text().split("\n\n") if p.strip()]
    if not paras:
        raise SystemExit(f"--prompts {prompts}: no text")
    paras = paras * -(-count // len(paras))
    rows = [
        {"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "-"}]}
        for p in paras
    ]
    path = out / "prompts_sharegpt.json"
    path.write_text(json.dumps(rows))
    return path


def n_prompts(args, conc: int) -> int:
    return max(conc * args.rounds, args.min_prompts)


def bench_command(args, conc: int, inp: int, outp: int, result: Path, data: Path | None):
    n = n_prompts(args, conc)
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang"]
    cmd += ["--base-url", args.url, "--tokenize-prompt", "--random-range-ratio", "1.0"]
    cmd += ["--random-input-len", str(inp), "--random-output-len", str(outp)]
    cmd += ["--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf"]
    cmd += ["--seed", str(args.seed), "--warmup-requests", "1", "--disable-tqdm"]
    cmd += ["--output-file", str(result)]
    cmd += ["--dataset-name", "random", "--dataset-path", str(data)] if data else []
    cmd += [] if data else ["--dataset-name", "random-ids"]
    cmd += ["--tokenizer", args.tokenizer] if args.tokenizer else []
    return cmd


def run_point(args, conc: int, inp: int, outp: int, log: Path, data=None, timeout=None):
    """One bench_serving run (its output appended to `log`): the point's dict (KEYS), or None
    when it failed or ran past `timeout` seconds (default args.timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "r.jsonl"
        cmd = bench_command(args, conc, inp, outp, result, data)
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(
                    cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout or args.timeout
                ).returncode
            except subprocess.TimeoutExpired:
                f.write(f"timed out after {timeout or args.timeout:.0f} s\n")
                return None
        lines = result.read_text().splitlines() if result.exists() else []
    if rc != 0 or not lines:
        return None
    raw = json.loads(lines[-1])
    point = {"input_len": inp, "output_len": outp, "max_concurrency": conc}
    point.update({k: raw.get(k) for k in KEYS})
    return point


def run_sweep(args) -> dict:
    from tqdm import tqdm

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if _get_json(args.url + "/model_info") is None:
        raise SystemExit(f"no SGLang server answers at {args.url} (GET /model_info failed)")
    most = max(n_prompts(args, c) for c in args.concurrency)
    data = sharegpt_file(Path(args.prompts), out, most) if args.prompts else None
    grid = [(i, o, c) for i in args.input_len for o in args.output_len for c in args.concurrency]
    points, log = [], out / "bench_serving.log"
    log.write_text("")
    bar = tqdm(grid, desc="serve_bench", unit="point", file=sys.stderr)
    for inp, outp, conc in bar:
        bar.set_postfix_str(f"in {inp} out {outp} conc {conc}")
        point = run_point(args, conc, inp, outp, log, data)
        if point is None:
            raise SystemExit(f"bench_serving failed at in {inp} out {outp} conc {conc}: see {log}")
        points.append(point)
    return {
        "label": args.label,
        "url": args.url,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _commit(),
        "command": " ".join(sys.argv),
        "source": f"prompts file {args.prompts}" if args.prompts else "random token ids",
        "model_info": _get_json(args.url + "/model_info"),
        "server_args": _server_args(_get_json(args.url + "/server_info")),
        "points": points,
    }


def _server_args(info) -> dict | None:
    if not isinstance(info, dict):
        return None
    keep = ("model_path", "device", "tp_size", "attn_dp_size", "attention_backend", "page_size")
    return {k: info[k] for k in keep if k in info}


def _commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
        return r.stdout.strip() or None
    except OSError:
        return None


def markdown(run: dict) -> str:
    head = (
        f"**{run['label'] or run['url']}** ({run['source']}; commit {run['commit']}, {run['date']})"
    )
    lines = [head, "", "| " + " | ".join(c[0] for c in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for p in run["points"]:
        cells = [fmt.format(p[key]) if p.get(key) is not None else "-" for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_markdown(a: dict, b: dict) -> str:
    na, nb = a["label"] or "A", b["label"] or "B"
    keyed = {(p["input_len"], p["output_len"], p["max_concurrency"]): p for p in b["points"]}
    rows = ["| in | out | conc | metric | " + f"{na} | {nb} | {nb} / {na} |", "|---" * 7 + "|"]
    for p in a["points"]:
        q = keyed.get((p["input_len"], p["output_len"], p["max_concurrency"]))
        if q is None:
            continue
        for key in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms"):
            x, y = p.get(key), q.get(key)
            ratio = f"{y / x:.2f}" if x and y is not None else "-"
            rows.append(
                f"| {p['input_len']} | {p['output_len']} | {p['max_concurrency']} | {key} | "
                f"{x:.2f} | {y:.2f} | {ratio} |"
            )
    return (
        f"{na}: {a['url']} ({a['commit']})\n{nb}: {b['url']} ({b['commit']})\n\n"
        + "\n".join(rows)
        + "\n"
    )


STYLES = {"median": "-", "p90": "--", "p99": ":"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _shapes(run: dict) -> list:
    return sorted({(p["input_len"], p["output_len"]) for p in run["points"]})


def _concurrencies(run: dict) -> list:
    return sorted({p["max_concurrency"] for p in run["points"]})


def _curve(run: dict, shape, key: str):
    pts = sorted(
        (p for p in run["points"] if (p["input_len"], p["output_len"]) == shape),
        key=lambda p: p["max_concurrency"],
    )
    return [p["max_concurrency"] for p in pts], [p.get(key) for p in pts]


def _save(plt, fig, title: str, png) -> None:
    """Title the figure, lay it out, write it as a PNG and close it."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _axes_style(ax, title: str, ylabel: str, log_y: bool = False, ticks=()) -> None:
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("max concurrency")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_run(run: dict, throughput_png: Path, latency_png: Path) -> None:
    plt = _pyplot()
    name = run["label"] or run["url"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for shape in _shapes(run):
        for ax, key in zip(axes, ("output_throughput", "request_throughput"), strict=True):
            x, y = _curve(run, shape, key)
            ax.plot(x, y, "o-", label=f"in {shape[0]} / out {shape[1]}")
    ticks = _concurrencies(run)
    _axes_style(axes[0], "output tokens/s", "tokens/s", ticks=ticks)
    _axes_style(axes[1], "requests/s", "requests/s", ticks=ticks)
    _save(plt, fig, f"{name}: throughput against concurrency", throughput_png)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, shape in enumerate(_shapes(run)):
        for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
            for pct, ls in STYLES.items():
                x, y = _curve(run, shape, f"{pct}_{metric}_ms")
                ax.plot(x, y, ls, marker="o", color=f"C{i}", label=f"in {shape[0]} {pct}")
    _axes_style(axes[0], "time to first token", "ms", log_y=True, ticks=ticks)
    _axes_style(axes[1], "time per output token", "ms", log_y=True, ticks=ticks)
    _save(plt, fig, f"{name}: latency percentiles (p50 solid, p90 dashed, p99 dotted)", latency_png)


def plot_compare(a: dict, b: dict, png: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    for j, run in enumerate((a, b)):
        name = run["label"] or ("A", "B")[j]
        for k, shape in enumerate(_shapes(run)):
            mk = "osv^"[k % 4]
            x, y = _curve(run, shape, "output_throughput")
            axes[0].plot(x, y, "-", marker=mk, color=f"C{j}", label=f"{name} in {shape[0]}")
            for ax, metric in zip(axes[1:], ("ttft", "tpot"), strict=True):
                for pct in ("median", "p99"):
                    x, y = _curve(run, shape, f"{pct}_{metric}_ms")
                    ax.plot(
                        x,
                        y,
                        STYLES[pct],
                        marker=mk,
                        color=f"C{j}",
                        label=f"{name} in {shape[0]} {pct}",
                    )
    ticks = sorted(set(_concurrencies(a)) | set(_concurrencies(b)))
    _axes_style(axes[0], "output tokens/s", "tokens/s", ticks=ticks)
    _axes_style(axes[1], "TTFT (p50 solid, p99 dotted)", "ms", log_y=True, ticks=ticks)
    _axes_style(axes[2], "TPOT (p50 solid, p99 dotted)", "ms", log_y=True, ticks=ticks)
    _save(plt, fig, f"{a['label'] or 'A'} vs {b['label'] or 'B'}", png)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--compare", nargs=2, metavar=("A_JSON", "B_JSON"))
    ap.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--input-len", type=_ints, default=[128, 1024])
    ap.add_argument("--output-len", type=_ints, default=[64])
    ap.add_argument("--rounds", type=int, default=4, help="requests per point = conc x rounds")
    ap.add_argument("--min-prompts", type=int, default=4)
    ap.add_argument("--prompts", help="text file whose paragraphs give the prompt tokens")
    ap.add_argument("--tokenizer", help="tokenizer dir (default: the server's /model_info path)")
    ap.add_argument("--label", default="", help="name of this run in tables and plots")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per point")
    ap.add_argument("--out", default="serve_bench_out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        (out / "compare.md").write_text(compare_markdown(a, b))
        plot_compare(a, b, out / "compare.png")
        print((out / "compare.md").read_text())
        return 0
    if not args.url:
        ap.error("--url or --compare is required")
    args.url = args.url.rstrip("/")
    run = run_sweep(args)
    (out / "serve_bench.json").write_text(json.dumps(run, indent=1))
    (out / "serve_bench.md").write_text(markdown(run))
    plot_run(run, out / "throughput.png", out / "latency.png")
    print(markdown(run))
    print(f"wrote {out}/serve_bench.json, serve_bench.md, throughput.png, latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
