"""The checks of a V4.1 config (`DeepseekV41Config.validate`): each failure is a ConfigError that
names the field, and the layer where there is one.

config.py stands on this file (its errors, its validation); this file imports nothing of
config.py and reads the config it is handed through its fields and role methods."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid V4.1 config; the message names the field (and the layer, where there is one)."""


def config_error(field_name: str, msg: str, layer: int | None = None) -> ConfigError:
    where = f" (layer {layer})" if layer is not None else ""
    return ConfigError(f"{field_name}{where}: {msg}")


def validate_config(cfg) -> None:
    """cfg: a DeepseekV41Config. Raise ConfigError naming the field and layer of the first
    problem found (the checks of `DeepseekV41Config.validate`)."""
    L = cfg.num_hidden_layers
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "head_dim",
        "q_lora_rank",
        "o_lora_rank",
        "o_groups",
        "index_n_heads",
        "index_head_dim",
    ):
        if int(getattr(cfg, name)) < 1:
            raise config_error(name, f"must be >= 1, got {getattr(cfg, name)}")
    if cfg.sliding_window < 1:
        raise config_error("sliding_window", f"must be >= 1, got {cfg.sliding_window}")
    if cfg.index_topk < 1:
        raise config_error("index_topk", f"must be >= 1, got {cfg.index_topk}")
    if cfg.qk_rope_head_dim > cfg.head_dim or cfg.qk_rope_head_dim % 2:
        raise config_error(
            "qk_rope_head_dim",
            f"{cfg.qk_rope_head_dim} must be even and <= head_dim {cfg.head_dim}",
        )
    if cfg.qk_rope_head_dim > cfg.index_head_dim:
        raise config_error(
            "qk_rope_head_dim",
            f"{cfg.qk_rope_head_dim} > index_head_dim {cfg.index_head_dim}",
        )
    if cfg.head_dim % 32:
        raise config_error(
            "head_dim",
            f"{cfg.head_dim} must be a multiple of 32 (one FP8 scale per 32 values)",
        )
    if cfg.index_head_dim % 32:
        raise config_error("index_head_dim", f"{cfg.index_head_dim} must be a multiple of 32")
    if (cfg.num_attention_heads * cfg.head_dim) % cfg.o_groups:
        raise config_error(
            "o_groups",
            f"{cfg.o_groups} does not divide num_attention_heads * "
            f"head_dim = {cfg.num_attention_heads * cfg.head_dim}",
        )
    if cfg.kv_cache_dtype_main not in ("fp4", "fp8"):
        raise config_error(
            "kv_cache_dtype_main", f"must be 'fp4' or 'fp8', got {cfg.kv_cache_dtype_main!r}"
        )
    if len(cfg.compress_ratios) < L:
        raise config_error(
            "compress_ratios",
            f"has {len(cfg.compress_ratios)} entries, need num_hidden_layers = {L}",
        )
    for i in range(L):
        r = cfg.compress_ratios[i]
        if r not in (0, 1, 2):
            raise config_error("compress_ratios", f"ratio {r} not in {{0, 1, 2}}", i)
        if i >= cfg.decoder_start and r not in (0, 1):
            raise config_error("compress_ratios", f"decoder ratio must be 0 or 1, got {r}", i)
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        ids = list(getattr(cfg, name))
        for j, s in enumerate(ids):
            if not isinstance(s, int) or not 0 <= s < L:
                raise config_error(
                    name, f"id {s} out of range [0, {L})", s if isinstance(s, int) else None
                )
            if j and s <= ids[j - 1]:
                what = "duplicated" if s == ids[j - 1] else "not sorted"
                raise config_error(name, f"ids {what} at {s}", s)
            if cfg.compress_ratios[s] == 0:
                raise config_error(name, "source layer has compress ratio 0", s)
    for s in cfg.kv_source_layer_ids:
        if s not in cfg.index_source_layer_ids:
            raise config_error(
                "kv_source_layer_ids",
                "kv source is not an index source (a Full layer must be in both lists)",
                s,
            )
    for i in range(L):
        if cfg.compress_ratios[i] == 0:
            continue
        if cfg.source_layer_of(i) < 0:
            raise config_error(
                "kv_source_layer_ids",
                f"no preceding kv source of ratio {cfg.compress_ratios[i]}",
                i,
            )
        if cfg.index_source_of(i) < 0:
            raise config_error(
                "index_source_layer_ids",
                f"no preceding index source of ratio {cfg.compress_ratios[i]}",
                i,
            )
    c = cfg.candidate_source_layer_id
    if c >= 0:
        # a Full layer: the checks above made every kv source an index source of ratio > 0
        if c not in cfg.kv_source_layer_ids or cfg.ratio(c) != 1:
            raise config_error("candidate_source_layer_id", "must be a ratio-1 Full layer", c)
        if cfg.candidate_topk_blocks < 1 or cfg.candidate_block_size < 1:
            raise config_error(
                "candidate_topk_blocks",
                "candidate_topk_blocks and "
                "candidate_block_size must be >= 1 with a candidate source",
                c,
            )
    if cfg.n_routed_experts:
        if not 1 <= cfg.num_experts_per_tok <= cfg.n_routed_experts:
            raise config_error(
                "num_experts_per_tok",
                f"{cfg.num_experts_per_tok} not in [1, n_routed_experts={cfg.n_routed_experts}]",
            )
        if cfg.moe_intermediate_size < 1:
            raise config_error("moe_intermediate_size", "must be >= 1 with routed experts")
    elif cfg.intermediate_size < 1:
        raise config_error("intermediate_size", "must be >= 1 when n_routed_experts = 0")
    if cfg.hc_mult < 1:
        raise config_error("hc_mult", f"must be >= 1, got {cfg.hc_mult}")
    for j, e in enumerate(cfg.engram_layer_ids):
        if not isinstance(e, int) or not 0 <= e < L:
            raise config_error("engram_layer_ids", f"id {e} out of range [0, {L})")
        if j and e <= cfg.engram_layer_ids[j - 1]:
            raise config_error("engram_layer_ids", "ids not sorted or duplicated", e)
    if cfg.engram_layer_ids:
        first = cfg.engram_layer_ids[0]
        if len(cfg.engram_num_embeddings) != len(cfg.engram_layer_ids):
            raise config_error(
                "engram_num_embeddings",
                f"{len(cfg.engram_num_embeddings)} table "
                f"sizes for {len(cfg.engram_layer_ids)} Engram layers",
            )
        for j, rows in enumerate(cfg.engram_num_embeddings):
            if int(rows) < 1:
                raise config_error(
                    "engram_num_embeddings", f"table size {rows} < 1", cfg.engram_layer_ids[j]
                )
        if cfg.engram_max_ngram_size < 2:
            raise config_error(
                "engram_max_ngram_size", "must be >= 2 (n-grams of 2.. tokens)", first
            )
        # engram_compressed_vocab_size is checked against the tokenizer when the hasher is
        # built (layers/engram.py); the FP8 row format's multiple-of-32 head dim by the
        # released-weight loader.
        for name in ("engram_n_heads", "engram_head_dim", "engram_vocab_size"):
            if int(getattr(cfg, name)) < 1:
                raise config_error(
                    name, f"must be >= 1 with Engram layers, got {getattr(cfg, name)}", first
                )
