"""Resident KV bytes against context length, and how many contexts fit next to the weights.

Two record layouts of the same model:
    dsv41   this package on Hopper: V4.1 records (main KV V41_FP4 288 B + index K 68 B per
            compressed entry, 890 B/token on V4.1-Flash); SWA a window of V41 records (528 B)
            per layer and request, plus the ratio-2 sources' pending pair. Bytes from the one
            byte calculator (`pool_geometry`).
    v4      upstream's Hopper layout: V4's 584 B record for main KV and SWA, index K unchanged
            (kv_report's V4 column; 1630 B/token on V4.1-Flash).
A request of L tokens holds `per_token * L + per_request` bytes.

Deployments on one node of 8 GPUs, budget per GPU = capacity - reserve - weights on that GPU:
    TP8     the tensors SGLang's in-tree V4 model keeps whole on every rank (`replicated_under`:
            wq_a, wkv, norms, compressors, indexers, mHC, router, Engram's wkv and gates) plus
            an eighth of the rest (wq_b / wo_a / wo_b by heads, experts, embedding and head by
            rows, Engram tables); the single KV head cannot be split, so every GPU holds the KV
            of every request: requests per node = requests per GPU.
    DP8     DP attention (`--attn-dp-size 8`): the TP8 set plus all attention weights,
            embedding and head whole on every GPU, the rest (MoE, Engram tables) split 8 ways;
            each GPU holds its own requests' KV: requests per node = 8 x requests per GPU.
Weights are the released checkpoint's text tensors (`weights.release_manifest`: FP8 / FP4 with
their scales; MTP and vision excluded), in GiB (2^30 B). GPU capacities are the datasheets'
(decimal GB: 141e9 B for the H200).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.serving.geometry import PoolGeometry

GiB = 2**30
CONTEXTS = [8192 * 2**k for k in range(8)]  # 8K .. 1M tokens
GPUS = {"8xH200": 141e9, "8xB200": 180e9}  # bytes per GPU (datasheet GB)
N_GPUS = 8
DEFAULT_RESERVE_GIB = 16.0
"""Activations, CUDA graphs, NCCL buffers: SGLang 0.5.23 reserves at least 10 GiB on GPUs over
60 GB (its memory_hook), more with 8K prefill chunks and decode graphs; 16 GiB is assumed."""


def pool_geometry(cfg: DeepseekV41Config) -> PoolGeometry:
    """The one byte calculator (serving/geometry.py), decoder replay on (the default)."""
    return PoolGeometry(cfg, True)


def v4_record_bytes(dim: int, rope: int) -> int:
    """V4's record: (D - R) e4m3 + R bf16 RoPE dims + one scale byte per 64 e4m3 values, padded
    to 8 bytes: 448 + 128 + 7 -> 584 at D = 512, R = 64."""
    raw = (dim - rope) + 2 * rope + -(-(dim - rope) // 64)
    return -(-raw // 8) * 8


@dataclass(frozen=True)
class Footprint:
    """What one request costs in a layout: per_token * L + per_request bytes."""

    layout: str
    per_token: float
    per_request: int

    def bytes_at(self, context: int) -> float:
        return self.per_token * context + self.per_request


def dsv41_footprint(cfg: DeepseekV41Config) -> Footprint:
    g = pool_geometry(cfg)
    per_request = g.swa_bytes_per_window() + g.pending_bytes_per_request()
    return Footprint("dsv41", g.global_bytes_per_token(), per_request)


def v4_footprint(cfg: DeepseekV41Config) -> Footprint:
    g = pool_geometry(cfg)
    v4 = v4_record_bytes(cfg.head_dim, cfg.qk_rope_head_dim)
    per_token = sum((v4 + g.index_record) / cfg.ratio(s) for s in cfg.kv_source_layer_ids)
    per_request = v4 * cfg.sliding_window * cfg.num_hidden_layers
    return Footprint("v4", per_token, per_request)


def cached_prefix_bytes(cfg: DeepseekV41Config, prefix_len: int) -> dict:
    """What keeping one cached prefix of `prefix_len` tokens hit-able costs, per layout.

    dsv41: its global KV alone (main KV + index K of the kv sources): SWA is evicted first and
    a hit without it resumes by bounded replay (docs/design.md 2.8). v4: SGLang's V4 layout
    (V4's record for main KV and SWA): its global KV plus the trailing SWA window of every
    layer, since there a radix match stops where the window it needs is gone.
    -> {layout: {"bytes": per prefix, "bytes_per_token", "tokens_per_gib"}}."""
    g = pool_geometry(cfg)
    v4 = v4_record_bytes(cfg.head_dim, cfg.qk_rope_head_dim)
    v4_global = sum((v4 + g.index_record) / cfg.ratio(s) for s in cfg.kv_source_layer_ids)
    window = min(prefix_len, cfg.sliding_window) * cfg.num_hidden_layers
    layouts = {
        "dsv41": g.global_bytes_per_token() * prefix_len,
        "v4": v4_global * prefix_len + v4 * window,
    }
    return {
        name: {
            "bytes": b,
            "bytes_per_token": b / prefix_len,
            "tokens_per_gib": GiB * prefix_len / b,
        }
        for name, b in layouts.items()
    }


_WHOLE_ON_EVERY_TP_RANK = re.compile(
    r"\.attn\.(wq_a|wkv|compressor|indexer)\.|norm\.weight$|\.hc_(attn|ffn)_"
    r"|\.ffn\.gate\.|\.engram\.(wkv\.|q_weight$|k_weight$)"
)


def replicated_under(deployment: str, name: str) -> bool:
    """True when every GPU of `deployment` (TP8 or DP8) holds the released tensor `name` whole.

    TP8: what SGLang's in-tree V4 model builds as replicated (ReplicatedLinear wq_a / wkv, the
    compressor and indexer, norms, mHC, the router, Engram's wkv and gates); DP8 adds every
    attention tensor and the embedding, final norm and head."""
    if deployment == "TP8":
        return bool(_WHOLE_ON_EVERY_TP_RANK.search(name))
    if deployment == "DP8":
        return replicated_under("TP8", name) or ".attn." in name or not name.startswith("layers.")
    raise ValueError(f"deployment must be TP8 or DP8, got {deployment!r}")


def weight_split(cfg: DeepseekV41Config) -> dict:
    """Released text weights in bytes: {'total', 'replicated_TP8', 'replicated_DP8'}."""
    from sglang_dsv41.weights.release_manifest import manifest_bytes, release_manifest

    m = release_manifest(cfg)
    out = {"total": manifest_bytes(m)}
    for dep in ("TP8", "DP8"):
        whole = {k: v for k, v in m.items() if replicated_under(dep, k)}
        out[f"replicated_{dep}"] = manifest_bytes(whole)
    return out


def weights_per_gpu(weights: dict, deployment: str) -> float:
    """Bytes of weights on one GPU: the replicated tensors whole, an eighth of the rest."""
    if deployment not in ("TP8", "DP8"):
        raise ValueError(f"deployment must be TP8 or DP8, got {deployment!r}")
    rep = weights[f"replicated_{deployment}"]
    return (weights["total"] - rep) / N_GPUS + rep


def capacity_rows(
    footprints: list, weights: dict, reserve_gib: float = DEFAULT_RESERVE_GIB
) -> list:
    """One row per (gpu, deployment, layout, context): bytes per request, budget per GPU,
    requests that fit per GPU and per node, and global-state tokens per GPU."""
    rows = []
    for gpu, cap in GPUS.items():
        for dep in ("TP8", "DP8"):
            w = weights_per_gpu(weights, dep)
            budget = max(cap - reserve_gib * GiB - w, 0.0)
            for fp in footprints:
                for ctx in CONTEXTS:
                    per_gpu = int(budget // fp.bytes_at(ctx))
                    rows.append(
                        {
                            "gpu": gpu,
                            "deployment": dep,
                            "layout": fp.layout,
                            "context": ctx,
                            "bytes_per_request": fp.bytes_at(ctx),
                            "weights_gib_per_gpu": w / GiB,
                            "kv_budget_gib_per_gpu": budget / GiB,
                            "requests_per_gpu": per_gpu,
                            "requests_per_node": per_gpu * (N_GPUS if dep == "DP8" else 1),
                            "tokens_per_gpu": int(budget // fp.per_token) if fp.per_token else 0,
                        }
                    )
    return rows


def capacity_report(
    cfg: DeepseekV41Config, weights_cfg: DeepseekV41Config | None = None, reserve_gib=None
) -> dict:
    """The plot's numbers: footprints, weights, assumptions and the capacity rows.

    weights_cfg: the config whose released tensors count as weights (default cfg)."""
    reserve = DEFAULT_RESERVE_GIB if reserve_gib is None else float(reserve_gib)
    fps = [dsv41_footprint(cfg), v4_footprint(cfg)]
    weights = weight_split(weights_cfg or cfg)
    return {
        "footprints": [asdict(f) for f in fps],
        "contexts": CONTEXTS,
        "weights_gib": {k: v / GiB for k, v in weights.items()},
        "gpu_bytes": dict(GPUS),
        "reserve_gib_per_gpu": reserve,
        "rows": capacity_rows(fps, weights, reserve),
    }
