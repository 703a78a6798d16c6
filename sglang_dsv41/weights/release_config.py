"""The released V4.1-Flash `config.json` layout, at full size and at flash-mini widths.

Released layout (docs/design.md 2.7, docs/release_format.md): top level `architectures`,
`model_type`, `quantization_config` {quant_method fp8, weight_block_size [32, 32], scale_fmt ue8m0,
expert_dtype fp4, activation_scheme dynamic}, `text_config` (every text field, 43
`compress_ratios` with the 3 MTP stages' zeros at the end), `vision_config` (the ViT; text-only
serving ignores it).

Engram facts at full size come from the reference's check values: tables start at
engram_vocab_size 16,000,000 (first prime 16000057), 8 heads x (max_ngram 4 - 1) n-gram sizes =
24 primes per layer, rows of 256, compressed vocab 99,092 (the size that reproduces the layer-1
multipliers). engram_pad_token_id (2) and the vision_config values are not audited; text-only
serving does not read the latter.

flash-mini keeps every structural fact (40 layers, the ratios, source lists, candidate source,
engram layers [1, 14], mHC 4 x 20 iterations, MoE scoring, quantization kinds) and shrinks the
widths, vocab, window, top-k, expert count and engram tables so it runs on a CPU in seconds.
"""

from __future__ import annotations

from sglang_dsv41.layers.engram import engram_primes
from sglang_dsv41.presets import flash

QUANTIZATION = {
    "quant_method": "fp8",
    "weight_block_size": [32, 32],
    "scale_fmt": "ue8m0",
    "expert_dtype": "fp4",
    "activation_scheme": "dynamic",
}
RELEASED_HF_KEYS = {
    "num_key_value_heads": 1,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}
"""Generic transformers keys the released text_config carries; SGLang's in-tree V4 model reads
some of them (it asserts one KV head; its Fp8Config requires `activation_scheme`)."""
TOP_LEVEL = ("architectures", "model_type", "torch_dtype", "bos_token_id", "eos_token_id")
FLASH_ENGRAM = {
    "engram_layer_ids": [1, 14],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 16_000_000,
    "engram_compressed_vocab_size": 99_092,
    "engram_pad_token_id": 2,
}


def engram_table_rows(text: dict) -> list:
    """Rows of each engram layer's table: the sum of its primes (what the hash addresses)."""
    primes = engram_primes(
        len(text["engram_layer_ids"]),
        text["engram_max_ngram_size"],
        text["engram_n_heads"],
        text["engram_vocab_size"],
    )
    return [sum(sum(k) for k in layer) for layer in primes]


def flash_text_config() -> dict:
    """Full-size V4.1-Flash text fields (flat dict, as `text_config` plus top-level keys)."""
    text = flash()
    text.update(RELEASED_HF_KEYS)
    text.update(FLASH_ENGRAM)
    text["engram_num_embeddings"] = engram_table_rows(text)
    text["hc_pre_from_prev_sublayer"] = True
    text["bos_token_id"], text["eos_token_id"] = 0, 1
    return text


def flash_mini_text_config(vocab_size: int = 512, compressed_vocab: int = 0) -> dict:
    """flash-mini: the release's structure at reduced widths (see module docstring).

    compressed_vocab: the tokenizer's engram compressed vocabulary size (known once the
    tokenizer exists; the writer fills it in).
    """
    text = flash_text_config()
    text.update(
        {
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "head_dim": 64,
            "qk_rope_head_dim": 16,
            "q_lora_rank": 32,
            "o_lora_rank": 16,
            "o_groups": 8,
            "sliding_window": 16,
            "index_n_heads": 2,
            "index_head_dim": 32,
            "index_topk": 8,
            "candidate_topk_blocks": 6,
            "candidate_block_size": 4,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "max_position_embeddings": 4096,
            "engram_n_heads": 2,
            "engram_head_dim": 32,
            "engram_vocab_size": 61,
            "engram_compressed_vocab_size": compressed_vocab,
            "torch_dtype": "bfloat16",
        }
    )
    text["engram_num_embeddings"] = engram_table_rows(text)
    return text


def release_config(text: dict, vision: dict) -> dict:
    """Nest flat text fields into the released config.json layout."""
    top = {k: text[k] for k in TOP_LEVEL if k in text}
    nested = {k: v for k, v in text.items() if k not in TOP_LEVEL}
    return {
        **top,
        "text_config": nested,
        "vision_config": dict(vision),
        "quantization_config": dict(QUANTIZATION),
    }


def flash_vision_config() -> dict:
    """Placeholder ViT fields (not audited; text-only serving skips `vision.*`)."""
    return {
        "model_type": "deepseek_v41_vision",
        "num_hidden_layers": 24,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "patch_size": 14,
    }


def flash_mini_vision_config() -> dict:
    return {
        **flash_vision_config(),
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
