"""Resident KV memory of a V4.1 model: per token of context, per request, and what a server
allocates for a memory budget (`serving.geometry`, the calculator the server sizes its pool with).

    python -m sglang_dsv41.tools.kv_report (--model DIR | --preset NAME) [--json] [--plot PNG]
        [--reserve-gib G] [--no-replay] [--budget-gib G] [--requests R] [--chunk C]
        [--swa-full-tokens-ratio R] [--context-len L] [--page P]

Global state (per token, kept for the whole context): each kv source keeps one main-KV record
and one index-K record per compressed entry, 1/ratio entries per token; Reuse / Reindex layers
read their source's records and own nothing. V4.1-Flash: 2.5 entries x (288 + 68) = 890 B.
SWA (per request): each layer keeps a window of V41 records (528 B at D = 512) per live request,
in the window-bounded SWA pool (and, with decoder replay on, per-request rings for the decoder).
The V4 column is the same model with main KV and SWA in V4's record (584 B at D = 512), what
upstream SGLang, vLLM and FlashMLA use on Hopper; index K unchanged.
--budget-gib sizes a pool as the server does ("pool_sizing" in --json). --plot writes resident
bytes against context length (8K .. 1M) for this package and upstream's V4 layout, and what fits
next to the weights per GPU at TP8 / DP8 on 8xH200 and 8xB200 (tools/kv_capacity.py says how);
--json carries the same numbers under "capacity", and the text report ends with the weights per
GPU (GiB = 2^30 B).
"""

from __future__ import annotations

import json
import sys

from sglang_dsv41.config import DeepseekV41Config, preset
from sglang_dsv41.serving.geometry import PoolGeometry, swa_slots_needed
from sglang_dsv41.tools.cli import cli_parser
from sglang_dsv41.tools.kv_capacity import v4_record_bytes


def capacity(
    g: PoolGeometry,
    budget: int,
    requests: int,
    chunk: int,
    context_len: int,
    page: int,
    eviction_interval: int = 128,
    swa_ratio: float | None = None,
) -> dict:
    """What the server's pool sizing allocates for `budget` bytes (sglang/pool_sizing.py): the
    SWA room `swa_ratio` x the global room (--swa-full-tokens-ratio), at least one request's
    window and two prefill chunks; without a ratio, the windows of `requests` requests."""
    least = swa_slots_needed(
        g.cfg.sliding_window, page, requests if swa_ratio is None else 1, chunk, eviction_interval
    )
    full, swa = g.sized(budget, swa_ratio, least, page, requests, context_len)
    total = g.total_bytes(full, swa, page, requests, context_len)
    return {
        "budget_bytes": budget,
        "requests": requests,
        "page_size": page,
        "chunk": chunk,
        "context_len": context_len,
        "full_slots": full,
        "swa_slots": swa,
        "swa_full_tokens_ratio": swa_ratio,
        "allocated_bytes": total,
        "buffer_bytes": g.buffer_bytes(full, swa, page, requests),
        "bytes_per_token_of_context": total / full if full else None,
    }


def report(cfg: DeepseekV41Config, replay: bool = True) -> dict:
    g = PoolGeometry(cfg, replay)
    index_b, v4_b = g.index_record, v4_record_bytes(cfg.head_dim, cfg.qk_rope_head_dim)
    W, L = cfg.sliding_window, cfg.num_hidden_layers
    layers, total_v4 = [], 0.0
    for i in range(L):
        r, own = cfg.ratio(i), i in cfg.kv_source_layer_ids
        per_tok = (g.main_record + index_b) / r if own else 0.0
        per_tok_v4 = (v4_b + index_b) / r if own else 0.0
        total_v4 += per_tok_v4
        layers.append(
            {
                "layer": i,
                "role": cfg.role(i),
                "ratio": r,
                "reads": cfg.source_layer_of(i),
                "global_bytes_per_token": per_tok,
                "v4_global_bytes_per_token": per_tok_v4,
                "swa_bytes_per_request": g.swa_record * W,
                "swa_in": "ring" if i in g.ring_layers else "swa_pool",
            }
        )
    return {
        "records": {
            "main_kv": cfg.main_kv_layout.name,
            "main_kv_bytes": g.main_record,
            "index_k_bytes": index_b,
            "swa_bytes": g.swa_record,
            "v4_record_bytes": v4_b,
        },
        "layers": layers,
        "global_bytes_per_token": g.global_bytes_per_token(),
        "v4_global_bytes_per_token": total_v4,
        "swa_bytes_per_request": g.swa_bytes_per_window(),
        "v4_swa_bytes_per_request": v4_b * W * L,
        "pool": {
            "replay": replay,
            "full_slot_bytes": g.global_bytes_per_token(),
            "swa_slot_bytes": g.swa_bytes_per_slot(),
            "swa_pool_layers": len(g.swa_layers),
            "ring_layers": len(g.ring_layers),
            "request_slot_state_bytes": g.state_bytes_per_request(),
            "ring_bytes_per_request": g.ring_bytes_per_request(),
        },
    }


def _text(rep: dict, name: str) -> str:
    rec, pool = rep["records"], rep["pool"]
    out = [
        f"{name}: main KV {rec['main_kv']} {rec['main_kv_bytes']} B, index K "
        f"{rec['index_k_bytes']} B, SWA V41 {rec['swa_bytes']} B per record",
        f"{'layer':>5} {'role':>8} {'ratio':>5} {'reads':>5} {'B/token':>9} {'V4 B/token':>10} "
        f"{'SWA B/req':>10} {'SWA in':>9}",
    ]
    for row in rep["layers"]:
        out.append(
            f"{row['layer']:>5} {row['role']:>8} {row['ratio']:>5} {row['reads']:>5} "
            f"{row['global_bytes_per_token']:>9.1f} {row['v4_global_bytes_per_token']:>10.1f} "
            f"{row['swa_bytes_per_request']:>10} {row['swa_in']:>9}"
        )
    out += [
        f"global state: {rep['global_bytes_per_token']:.1f} B/token "
        f"(V4 {rec['v4_record_bytes']} B record: {rep['v4_global_bytes_per_token']:.1f} B/token)",
        f"SWA: {rep['swa_bytes_per_request']} B per live request "
        f"(V4 {rec['v4_record_bytes']} B record: {rep['v4_swa_bytes_per_request']} B)",
        f"dsv41 serving pool (replay {'on' if pool['replay'] else 'off'}): "
        f"{pool['full_slot_bytes']:.1f} B per full slot (token of context), "
        f"{pool['swa_slot_bytes']} B per SWA slot ({pool['swa_pool_layers']} layers), "
        f"{pool['request_slot_state_bytes']} B per request slot "
        f"(decoder SWA rings of {pool['ring_layers']} layers: {pool['ring_bytes_per_request']} B)",
    ]
    w = rep.get("capacity", {}).get("rows")
    if w:
        per_gpu = {r["deployment"]: r["weights_gib_per_gpu"] for r in w}
        out.append(
            f"released text weights {rep['capacity']['weights_gib']['total']:.2f} GiB: "
            f"{per_gpu['TP8']:.2f} GiB per GPU at TP8, {per_gpu['DP8']:.2f} GiB under DP8 "
            "attention (tools/kv_capacity.py)"
        )
    cap = rep.get("pool_sizing")
    if cap:
        out.append(
            f"budget {cap['budget_bytes'] / 2**30:.2f} GiB, {cap['requests']} request slots, "
            f"chunk {cap['chunk']}: {cap['full_slots']} tokens of context + {cap['swa_slots']} "
            f"SWA slots = {cap['allocated_bytes'] / 2**30:.3f} GiB, "
            f"{cap['bytes_per_token_of_context']:.1f} B per token of context"
        )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = cli_parser("sglang_dsv41.tools.kv_report", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (config.json)")
    src.add_argument("--preset", help="tiny | small | flash")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--plot", metavar="PNG", help="write the capacity plot (8K .. 1M tokens)")
    ap.add_argument(
        "--reserve-gib",
        type=float,
        default=None,
        help="per-GPU memory kept for activations and graphs in the capacity figures (16)",
    )
    ap.add_argument("--no-replay", action="store_true", help="decoder bounded replay off")
    ap.add_argument("--budget-gib", type=float, help="KV budget to size a pool for")
    ap.add_argument("--requests", type=int, default=2048, help="request slots (default 2048)")
    ap.add_argument("--chunk", type=int, default=8192, help="prefill chunk (default 8192)")
    ap.add_argument(
        "--swa-full-tokens-ratio",
        type=float,
        default=None,
        help="SWA room / global room, as SGLang's flag (default: the requests' windows)",
    )
    ap.add_argument("--context-len", type=int, help="slot table row (default: max positions)")
    ap.add_argument(
        "--page", type=int, default=2, help="page size (default 2, the served page size)"
    )
    args = ap.parse_args(argv)
    cfg = DeepseekV41Config.from_hf(args.model) if args.model else preset(args.preset)
    rep = report(cfg, replay=not args.no_replay)
    if args.budget_gib:
        g = PoolGeometry(cfg, not args.no_replay)
        ctx = args.context_len or cfg.max_position_embeddings
        rep["pool_sizing"] = capacity(
            g,
            int(args.budget_gib * 2**30),
            args.requests,
            args.chunk,
            ctx,
            args.page,
            swa_ratio=args.swa_full_tokens_ratio,
        )
    name = args.model or args.preset
    rep["capacity"] = _capacity(cfg, args.preset, args.reserve_gib)
    if args.plot:
        from sglang_dsv41.tools.kv_plot import plot_capacity

        plot_capacity(rep["capacity"], args.plot, title=f"{name}: resident KV and capacity")
    print(json.dumps(rep, indent=1) if args.json else _text(rep, name))
    return 0


def _capacity(cfg: DeepseekV41Config, preset_name, reserve_gib) -> dict:
    from sglang_dsv41.tools.kv_capacity import capacity_report

    weights_cfg = None
    if preset_name == "flash":
        # The flash preset is the attention geometry; the released checkpoint's weights also
        # hold its two Engram tables (~189 GiB), which count against the KV budget.
        from sglang_dsv41.weights.release_config import flash_text_config

        weights_cfg = DeepseekV41Config.from_dict(flash_text_config())
    return capacity_report(cfg, weights_cfg, reserve_gib)


if __name__ == "__main__":
    sys.exit(main())
