"""One decode step of the whole V4.1-Flash attention stack: ours against upstream's Hopper layout.

    python benchmarks/bench_decode_stack.py [--quick] [--json PATH] [--budget-gb 120]
                                             [--batches 32] [--contexts 8192,1048576] [--exact-q]
                                             [--page-size 64] [--replay]
    python benchmarks/bench_decode_stack.py --dry-run [--json PATH]   (CPU, tiny preset, refs)

The step: 40 layers of every role (SWA-only L0-1; Full at L2/8/14 ratio 2 and L20 ratio 1, the
candidate source; Reindex at L24/28/32/36; Reuse elsewhere), q / SWA-kv / compressor / indexer /
output projections at real widths with random bf16 weights, for batch 1 / 32 / 128 and context
8K / 128K / 1M (--quick: batch 1 / 32, context 8K / 1M). Columns, same run:
    ours      the served path (benchmarks/decode_stack.py): `serving.context.decode_context`,
              `serving.layer_loop.run_layers` and `serving.attention.attention_layer` over a
              `RecordBuffers` pool (V41 SWA, V41_FP4 main KV, 68 B index K; Reindex over the
              candidate pool; our sparse attention), with bf16 attention I/O (--exact-q: fp32
              queries, the served default); SWA windows in the SWA pool (--replay: the decoder's
              in request rings, as the server with bounded replay on); pages of --page-size
    upstream  V4 584 B records, Reindex over the whole context then masked, FlashMLA's SM90
              legacy sparse decode (`flash_mla`; benchmarks/decode_stack_upstream.py);
              unavailable where flash_mla does not import
    proj      the projections and layer math alone (shared by both; per batch)
Times: median of `triton.testing.do_bench` over CUDA-graph replays of the whole step (L2
flushed before each replay), microseconds. A layout whose KV for a config (bytes per request x
batch, from the calculator) exceeds --budget-gb is skipped and the row says so; an out-of-memory
is recorded the same way. Memory per token and per request: tools.kv_capacity (the one byte
calculator for ours, v4_record_bytes for upstream). Checks per config, outside the timing: the
step's output is finite, and our pooled Reindex selects the same entries as the whole-context
one on the same inputs (`reindex_agree`: the fraction of our ids the other also picked).
Goal row: 1M context, batch 32: ours <= 1/3 of upstream's step, <= 1/1.8 of its bytes/token.
--dry-run: the tiny preset on CPU, contexts 64 / 256, batch 1 / 3, eager calls timed with a
wall clock (plumbing only: the figures mean nothing); upstream runs without attention there
and its column is unavailable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_stack as ds  # noqa: E402  (benchmarks/ is not a package)
import decode_stack_upstream as dsu  # noqa: E402
from graph_timing import graph_us  # noqa: E402

from sglang_dsv41.config import preset  # noqa: E402
from sglang_dsv41.tools.kv_capacity import dsv41_footprint, v4_footprint  # noqa: E402

K = 1024
BATCHES, CONTEXTS = (1, 32, 128), (8 * K, 128 * K, K * K)
QUICK_BATCHES, QUICK_CONTEXTS = (1, 32), (8 * K, K * K)
DRY_BATCHES, DRY_CONTEXTS = (1, 3), (64, 256)
GOAL = dict(B=32, ctx=K * K, time=1 / 3, bytes=1 / 1.8)


def commit() -> str:
    if os.environ.get("DSV41_COMMIT"):
        return os.environ["DSV41_COMMIT"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def step_us(fn, device) -> float:
    """Median us of one CUDA-graph replay of fn() (L2 flushed before each); on CPU the wall
    clock of one eager call."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return graph_us(fn, warmup=25, rep=150)


def flashmla_status(device) -> tuple[bool, str]:
    """(usable, why): FlashMLA's SM90 decode needs a CUDA device and an importable flash_mla."""
    if device.type != "cuda":
        return False, "no CUDA device"
    try:
        import flash_mla  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from its CUDA libraries
        return False, f"flash_mla does not import ({type(exc).__name__}: {exc})"[:200]
    return True, "flash_mla " + getattr(flash_mla, "__version__", "?")


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of the ids of a int [T, K] (-1 = none) that the same row of b also holds."""
    a, b = a.long(), b.long()
    hit = (a[:, :, None] == b[:, None, :]).any(-1) & (a >= 0)  # [T, K]
    return float(hit.sum()) / max(int((a >= 0).sum()), 1)


def in_pool(ids: torch.Tensor, pool: torch.Tensor, block: int) -> bool:
    """Every id of ids int [T, K] (-1 = none) lies in a block of pool int [T, NB]."""
    blk = ids.long() // block
    inside = (blk[:, :, None] == pool.long()[:, None, :]).any(-1)  # [T, K]
    return bool((inside | (ids < 0)).all())


def check_ours(cfg, stack: ds.ServedStack) -> dict:
    """Eager step with a trace: finite output; pooled vs whole-context Reindex per layer."""
    with ds.reindex_trace(dsu.reindex_whole_context) as calls:
        out = stack.step()
    layers = [i for i in range(cfg.num_hidden_layers) if cfg.uses_candidates(i)]
    if len(calls) != len(layers):
        raise RuntimeError(f"{len(calls)} Reindex calls in the step, {len(layers)} layers")
    agree = [agreement(a, b) for a, b, _ in calls]
    inside = all(in_pool(a, p, cfg.candidate_block_size) for a, _, p in calls)
    return dict(
        finite=bool(torch.isfinite(out).all()),
        reindex_layers=layers,
        reindex_agree=min(agree) if agree else None,
        reindex_in_pool=inside,
    )


def run_ours(cfg, model, B, ctx, device, args) -> dict:
    """Time our served step (its pool built here, freed on return): {us, check fields}."""
    attn_dtype = None if args.exact_q else torch.bfloat16
    stack = ds.served_stack(
        model, B, ctx, device, args.page_size, args.replay, attn_dtype, seed=B + ctx
    )
    try:
        res = {"alloc_gb": stack.nbytes() / 1e9}
        res.update(check_ours(cfg, stack))
        res["us"] = step_us(stack.step, device)
        return res
    finally:
        stack = None  # the pool goes before the next layout allocates its own
        if device.type == "cuda":
            torch.cuda.empty_cache()


def run_upstream(cfg, layers, B, ctx, device, flashmla) -> dict:
    """Time upstream's step (its caches built here, freed on return): {us, finite}."""
    batch = dsu.make_batch(B, ctx, cfg.sliding_window, device, seed=B + ctx)
    h0 = torch.randn(B, cfg.hidden_size, device=device).to(layers[0].wq_a.weight.dtype)
    caches = dsu.make_caches(cfg, batch, "upstream", device, flashmla=flashmla)
    try:
        res = {"alloc_gb": caches.nbytes() / 1e9}
        out = dsu.decode_step(cfg, layers, batch, caches, h0)
        res["finite"] = bool(torch.isfinite(out).all())
        if caches.fm_meta is not None:
            res["us"] = step_us(lambda: dsu.decode_step(cfg, layers, batch, caches, h0), device)
        return res
    finally:
        caches = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="batch 1 / 32, context 8K / 1M")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny preset, references")
    ap.add_argument("--budget-gb", type=float, default=120.0, help="KV bytes per layout")
    ap.add_argument("--batches", default=None, help="comma list, overrides the sweep")
    ap.add_argument("--contexts", default=None, help="comma list, overrides the sweep")
    ap.add_argument(
        "--exact-q", action="store_true", help="ours with fp32 queries (the served layer's)"
    )
    ap.add_argument("--page-size", type=int, default=ds.PAGE, help="ours: the pool's page")
    ap.add_argument("--replay", action="store_true", help="ours: decoder SWA in request rings")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.dry_run:
        cfg, device = preset("tiny"), torch.device("cpu")
        batches, contexts = DRY_BATCHES, DRY_CONTEXTS
    else:
        cfg, device = preset("flash"), torch.device("cuda")
        batches, contexts = (QUICK_BATCHES, QUICK_CONTEXTS) if args.quick else (BATCHES, CONTEXTS)
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    if args.contexts:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    flashmla, why = flashmla_status(device)
    fp = {"ours": dsv41_footprint(cfg), "upstream": v4_footprint(cfg)}
    res = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        torch=torch.__version__,
        commit=commit(),
        time=time.ctime(),
        dry_run=args.dry_run,
        flash_mla=flashmla,
        flash_mla_status=why,
        ours_path="served (serving.layer_loop.run_layers)",
        ours_queries="fp32 (exact path)" if args.exact_q else "bf16",
        page_size=args.page_size,
        replay=args.replay,
        budget_gb=args.budget_gb,
        roles={r: cfg.roles().count(r) for r in sorted(set(cfg.roles()))},
        bytes_per_token={k: f.per_token for k, f in fp.items()},
        bytes_per_request_fixed={k: f.per_request for k, f in fp.items()},
        rows=[],
    )
    # bf16 weights; the dry run's fp32 only saves CPU time
    wdtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layers = ds.build_layers(cfg, device, wdtype)
    model = ds.StackModel(cfg, layers, max(batches), device, wdtype)
    res["weights_gb"] = ds.layers_bytes(layers) / 1e9
    print(f"{res['device']}: {cfg.num_hidden_layers} layers {res['roles']}, weights "
          f"{res['weights_gb']:.1f} GB, flash_mla {flashmla}", flush=True)  # fmt: skip

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)

    res["proj_us"] = {}
    for B in batches:
        batch = dsu.make_batch(B, min(contexts), cfg.sliding_window, device)
        h0 = torch.randn(B, cfg.hidden_size, device=device).to(wdtype)
        caches = dsu.make_caches(cfg, batch, "proj", device)
        res["proj_us"][B] = step_us(lambda: dsu.decode_step(cfg, layers, batch, caches, h0), device)
        print(f"proj batch {B}: {res['proj_us'][B]:.1f} us", flush=True)
    caches = None

    for ctx in sorted(contexts):
        for B in batches:
            row = dict(B=B, ctx=ctx, proj_us=res["proj_us"][B])
            need = {k: f.bytes_at(ctx) * B / 1e9 for k, f in fp.items()}
            for k in fp:
                row[f"{k}_kv_gb"] = need[k]
                row[f"{k}_bytes_per_request"] = fp[k].bytes_at(ctx)
            runs = [k for k in fp if need[k] <= args.budget_gb]
            for k in fp:
                if k not in runs:
                    row[f"{k}_note"] = f"skipped: KV {need[k]:.0f} GB > {args.budget_gb:.0f} GB"
            if "upstream" in runs and not flashmla and device.type == "cuda":
                row["upstream_note"] = f"unavailable: {why}"
                runs.remove("upstream")
            for k in runs:
                try:
                    if k == "ours":
                        r = run_ours(cfg, model, B, ctx, device, args)
                    else:
                        r = run_upstream(cfg, layers, B, ctx, device, flashmla)
                except torch.cuda.OutOfMemoryError as exc:
                    row[f"{k}_note"] = f"out of memory: {str(exc).splitlines()[0][:160]}"
                    torch.cuda.empty_cache()
                    continue
                row[f"{k}_us"] = r.pop("us", None)
                row.update({f"{k}_{n}": v for n, v in r.items()})
                if k == "upstream" and row["upstream_us"] is None:
                    row["upstream_note"] = "unavailable: no flash_mla (plumbing ran)"
            ours, up = row.get("ours_us"), row.get("upstream_us")
            row["time_ratio"] = ours / up if ours and up else None
            p = row["proj_us"]
            row["time_ratio_without_proj"] = (
                (ours - p) / (up - p) if ours and up and up > p else None
            )
            row["bytes_per_token_ratio"] = fp["ours"].per_token / fp["upstream"].per_token
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()

    goal = [r for r in res["rows"] if r["B"] == GOAL["B"] and r["ctx"] == GOAL["ctx"]]
    if goal:
        g = goal[0]
        res["goal"] = dict(
            time_ratio=g["time_ratio"],
            time_met=g["time_ratio"] is not None and g["time_ratio"] <= GOAL["time"],
            bytes_per_token_ratio=g["bytes_per_token_ratio"],
            bytes_met=g["bytes_per_token_ratio"] <= GOAL["bytes"],
        )
    save()
    print_table(res)
    return 0


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def _ctx(n: int) -> str:
    return f"{n // K}K" if n >= K and n % K == 0 else str(n)


def print_table(res: dict) -> None:
    print(f"\n{res['device']}, torch {res['torch']}, {res['commit']}; graph-replay us per step")
    print("| batch | context | ours us | upstream us | ours/up | ours/up w/o proj | proj us "
          "| B/token ours/up | GB/request ours / up | note |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        note = "; ".join(r[k] for k in ("ours_note", "upstream_note") if k in r)
        bpt = res["bytes_per_token"]
        print(
            f"| {r['B']} | {_ctx(r['ctx'])} | {_f(r.get('ours_us'))} | "
            f"{_f(r.get('upstream_us'))} | {_f(r['time_ratio'], '{:.3f}')} | "
            f"{_f(r['time_ratio_without_proj'], '{:.3f}')} | {_f(r['proj_us'])} | "
            f"{bpt['ours']:.0f}/{bpt['upstream']:.0f} = {r['bytes_per_token_ratio']:.3f} | "
            f"{r['ours_bytes_per_request'] / 1e9:.3f} / "
            f"{r['upstream_bytes_per_request'] / 1e9:.3f} | {note} |"
        )
    if "goal" in res:
        g = res["goal"]
        print(
            f"goal (1M, batch 32): time ours/up {_f(g['time_ratio'], '{:.3f}')} "
            f"(<= 0.333: {'met' if g['time_met'] else 'NOT met'}), bytes/token ours/up "
            f"{g['bytes_per_token_ratio']:.3f} (<= 0.556: {'met' if g['bytes_met'] else 'NOT met'})"
        )


if __name__ == "__main__":
    sys.exit(main())
