"""Config presets as released-style `config.json` text dicts.

tiny   CI: every role (SWA, Full, Reuse, Reindex), two encoder groups, two Reindex layers,
       ratios 2 and 1; prompts of 64-512 tokens exceed its window (16), top-k (8) and candidate
       pool (12 blocks x 4 = 48 positions).
small  CPU demo: the same layout, wider.
flash  V4.1-Flash attention geometry (docs/design.md 2.1).
retrieval  the trained model served by default: tiny's roles, wider (docs/retrieval_model.md).
"""


def _yarn(factor: float, original: int) -> dict:
    return {
        "type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": 32,
        "beta_slow": 1,
    }


def tiny() -> dict:
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 12,
        "num_attention_heads": 4,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "sliding_window": 16,
        "compress_ratios": [0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1],
        "kv_source_layer_ids": [1, 3, 6],
        "index_source_layer_ids": [1, 3, 6, 8, 10],
        "candidate_source_layer_id": 6,
        "candidate_topk_blocks": 12,
        "candidate_block_size": 4,
        "index_n_heads": 2,
        "index_head_dim": 32,
        "index_topk": 8,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": _yarn(4, 256),
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "swiglu_limit": 10.0,
        "hc_mult": 1,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }


def small() -> dict:
    cfg = tiny()
    cfg.update(
        {
            "hidden_size": 256,
            "num_hidden_layers": 16,
            "num_attention_heads": 8,
            "head_dim": 128,
            "qk_rope_head_dim": 32,
            "q_lora_rank": 128,
            "o_lora_rank": 128,
            "o_groups": 4,
            "sliding_window": 32,
            "compress_ratios": [0] + [2] * 7 + [1] * 8,
            "kv_source_layer_ids": [1, 4, 8],
            "index_source_layer_ids": [1, 4, 8, 10, 12, 14],
            "candidate_source_layer_id": 8,
            "candidate_topk_blocks": 32,
            "candidate_block_size": 8,
            "index_n_heads": 4,
            "index_head_dim": 64,
            "index_topk": 32,
            "n_routed_experts": 8,
            "moe_intermediate_size": 128,
        }
    )
    return cfg


def flash() -> dict:
    ratios = [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0]
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "vocab_size": 129280,
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 64,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1280,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "sliding_window": 128,
        "compress_ratios": ratios,
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20,
        "candidate_topk_blocks": 2048,
        "candidate_block_size": 8,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "index_topk": 512,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": _yarn(16, 65536),
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-20,
        "n_routed_experts": 384,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2304,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "swiglu_limit": 10.0,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "num_nextn_predict_layers": 3,
        "torch_dtype": "bfloat16",
    }


def retrieval() -> dict:
    """The trained retrieval model (docs/retrieval_model.md): tiny's layout of roles, wider,
    with a window of 32 and a top-k of 16 entries in a candidate pool of 16 blocks x 8 = 128
    positions, so that past a few hundred tokens an answer must come through the indexer.

    Global layers use RoPE base 500 and no YaRN: every rotary frequency turns through a full
    period within 1.5K positions, so a model trained on 0.25-4K tokens has seen every angle it
    meets at 16K (a large base leaves slow dimensions whose angles at 16K were never trained).
    """
    cfg = tiny()
    cfg.update(
        {
            "hidden_size": 128,
            "q_lora_rank": 64,
            "o_lora_rank": 64,
            "sliding_window": 32,
            "candidate_topk_blocks": 16,
            "candidate_block_size": 8,
            "index_n_heads": 4,
            "index_head_dim": 64,
            "index_topk": 16,
            "compress_rope_theta": 500.0,
            "rope_scaling": None,
            "max_position_embeddings": 32768,
            "moe_intermediate_size": 64,
        }
    )
    return cfg


PRESETS = {"tiny": tiny, "small": small, "flash": flash, "retrieval": retrieval}
