"""Resident KV memory of a V4.1 model, per token and per request, by layer.

    python -m sglang_dsv41.tools.kv_report (--model DIR | --preset NAME) [--json]

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
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_dsv41.config import DeepseekV41Config, preset
from sglang_dsv41.kv.records import Layout, record_bytes


def v4_record_bytes(dim: int, rope: int) -> int:
    """V4's record: (D - R) e4m3 + R bf16 RoPE dims + one scale byte per 64 e4m3 values, padded
    to 8 bytes: 448 + 128 + 7 -> 584 at D = 512, R = 64."""
    raw = (dim - rope) + 2 * rope + -(-(dim - rope) // 64)
    return -(-raw // 8) * 8


def report(cfg: DeepseekV41Config) -> dict:
    main_layout = Layout.V41_FP4 if cfg.kv_cache_dtype_main == "fp4" else Layout.V41
    main_b = record_bytes(main_layout, cfg.head_dim)
    index_b = record_bytes(Layout.INDEX_K, cfg.index_head_dim)
    swa_b = record_bytes(Layout.V41, cfg.head_dim)
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
            "main_kv": main_layout.name,
            "main_kv_bytes": main_b,
            "index_k_bytes": index_b,
            "swa_bytes": swa_b,
            "v4_record_bytes": v4_b,
        },
        "layers": layers,
        "global_bytes_per_token": total,
        "v4_global_bytes_per_token": total_v4,
        "swa_bytes_per_request": swa_b * W * L,
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
    args = ap.parse_args(argv)
    cfg = DeepseekV41Config.from_hf(args.model) if args.model else preset(args.preset)
    rep = report(cfg)
    print(json.dumps(rep, indent=1) if args.json else _text(rep, args.model or args.preset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
