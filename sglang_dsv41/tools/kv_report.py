"""Resident KV memory of a V4.1 model, per token and per request, by layer.

    python -m sglang_dsv41.tools.kv_report (--model DIR | --preset NAME) [--json] [--plot PNG]

Global state (per token, kept for the whole context): each kv source keeps one main-KV record
and one index-K record per compressed entry, 1/ratio entries per token; Reuse / Reindex layers
read their source's records and own nothing. V4.1-Flash: 2.5 entries x (288 + 68) = 890 B.
SWA (per request): each layer keeps a window of V41 records (528 B at D = 512) per live request.
The V4 column is the same model with main KV and SWA in V4's record (584 B at D = 512) (what
upstream
SGLang, vLLM and FlashMLA use on Hopper), index K unchanged.
Also shown: what the `dsv41` serving pool allocates: per token slot the global state plus the
SWA records of the layers whose SWA lives in slots (encoder layers with replay on, every layer
with replay off), and per request the decoder SWA rings (docs/serving.md).
--plot writes resident bytes against context length (8K .. 1M) for this package and upstream's
V4 layout, and what fits next to the weights per GPU at TP8 / DP8 on 8xH200 and 8xB200
(tools/kv_capacity.py says how); --json then carries the same numbers under "capacity".
Byte figures come from the one byte calculator (`kv_capacity.pool_geometry`).
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_dsv41.config import DeepseekV41Config, preset
from sglang_dsv41.tools.kv_capacity import pool_geometry, v4_record_bytes


def report(cfg: DeepseekV41Config) -> dict:
    g = pool_geometry(cfg)
    main_layout = "V41_FP4" if cfg.kv_cache_dtype_main == "fp4" else "V41"
    main_b, index_b, swa_b = g.main_record, g.index_record, g.swa_record
    W, L = cfg.sliding_window, cfg.num_hidden_layers
    v4_b = v4_record_bytes(cfg.head_dim, cfg.qk_rope_head_dim)
    layers, total, total_v4 = [], 0.0, 0.0
    for i in range(L):
        r, role = cfg.ratio(i), cfg.role(i)
        own = i in cfg.kv_source_layer_ids
        per_tok = (main_b + index_b) / r if own else 0.0
        per_tok_v4 = (v4_b + index_b) / r if own else 0.0
        total += per_tok
        total_v4 += per_tok_v4
        layers.append(
            {
                "layer": i,
                "role": role,
                "ratio": r,
                "reads": cfg.source_layer_of(i),
                "global_bytes_per_token": per_tok,
                "v4_global_bytes_per_token": per_tok_v4,
                "swa_bytes_per_request": swa_b * W,
            }
        )
    return {
        "records": {
            "main_kv": main_layout,
            "main_kv_bytes": main_b,
            "index_k_bytes": index_b,
            "swa_bytes": swa_b,
            "v4_record_bytes": v4_b,
        },
        "layers": layers,
        "global_bytes_per_token": g.global_bytes_per_token(),
        "v4_global_bytes_per_token": total_v4,
        "swa_bytes_per_request": g.swa_bytes_per_window(),
        "v4_swa_bytes_per_request": v4_b * W * L,
        "cpu_pool_bytes_per_token_slot": int(total + swa_b * cfg.decoder_start + 0.999),
        "cpu_pool_ring_bytes_per_request": swa_b * W * (L - cfg.decoder_start),
        "cpu_pool_bytes_per_token_slot_replay_off": int(total + swa_b * L + 0.999),
    }


def _text(rep: dict, name: str) -> str:
    rec = rep["records"]
    out = [
        f"{name}: main KV {rec['main_kv']} {rec['main_kv_bytes']} B, index K "
        f"{rec['index_k_bytes']} B, SWA V41 {rec['swa_bytes']} B per record",
        f"{'layer':>5} {'role':>8} {'ratio':>5} {'reads':>5} {'B/token':>9} {'V4 B/token':>10} "
        f"{'SWA B/req':>10}",
    ]
    for row in rep["layers"]:
        out.append(
            f"{row['layer']:>5} {row['role']:>8} {row['ratio']:>5} {row['reads']:>5} "
            f"{row['global_bytes_per_token']:>9.1f} {row['v4_global_bytes_per_token']:>10.1f} "
            f"{row['swa_bytes_per_request']:>10}"
        )
    out += [
        f"global state: {rep['global_bytes_per_token']:.1f} B/token "
        f"(V4 {rec['v4_record_bytes']} B record: {rep['v4_global_bytes_per_token']:.1f} "
        "B/token)",
        f"SWA: {rep['swa_bytes_per_request']} B per request "
        f"(V4 {rec['v4_record_bytes']} B record: {rep['v4_swa_bytes_per_request']} B)",
        f"dsv41 serving pool: {rep['cpu_pool_bytes_per_token_slot']} B per token slot + "
        f"{rep['cpu_pool_ring_bytes_per_request']} B decoder SWA rings per request (replay "
        f"on, default); {rep['cpu_pool_bytes_per_token_slot_replay_off']} B per token slot "
        "with replay off (every layer's SWA record kept per slot)",
    ]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.kv_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    args = ap.parse_args(argv)
    cfg = DeepseekV41Config.from_hf(args.model) if args.model else preset(args.preset)
    name = args.model or args.preset
    rep = report(cfg)
    if args.json or args.plot:
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
