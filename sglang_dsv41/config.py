"""DeepseekV41Config: the V4.1 text-model configuration, its derived layer roles and validation.

Parsed from a Hugging Face `config.json` as released (text fields may sit under `text_config`)
or from a dict. Roles are derived from `kv_source_layer_ids` / `index_source_layer_ids`, never
stored (docs/design.md 2.1):

    SWA      compress ratio 0: sliding-window attention only, no global branch
    FULL     in both lists: owns main KV + index K, runs the indexer
    REINDEX  index source only: own indexer queries over the source layer's main KV + index K
    REUSE    neither: the source layer's main KV and the index source's top-k, unchanged

A Reuse/Reindex layer reads the nearest preceding kv source of the same ratio
(`source_layer_of`) and the top-k of the nearest preceding index source of the same ratio
(`index_source_of`). Errors name the field and the layer: `ConfigError`, defined with the
checks in config_checks.py, which this file stands on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from sglang_dsv41.config_checks import ConfigError, config_error, validate_config

SWA, FULL, REINDEX, REUSE = "swa", "full", "reindex", "reuse"


@dataclass
class DeepseekV41Config:
    """DeepSeek-V4.1 text configuration. Every field of docs/design.md 2.

    Attention geometry:
        vocab_size, hidden_size, num_hidden_layers: the text stack (MTP stages not counted).
        num_attention_heads (H), head_dim (D): query heads and their width; one shared KV head
            (MQA, K = V) of width D.
        qk_rope_head_dim: RoPE dims, the *last* `qk_rope_head_dim` of every head (interleaved
        pairs).
        q_lora_rank: width of the low-rank query latent (`wq_a` out, `q_norm`).
        o_groups, o_lora_rank: grouped output projection; `o` [T, H*D] viewed as
            [T, o_groups, H*D/o_groups], `wo_a` per group -> o_lora_rank, then `wo_b`.
        sliding_window: SWA window (a query at pos sees [pos-window+1, pos]).
        attn_softmax_scale: None = D ** -0.5.
    Global branch (CSA2):
        compress_ratios: per layer, 0 (SWA only), 1 or 2; may hold extra MTP entries, only the
            first num_hidden_layers are read.
        kv_source_layer_ids: Full layers (own main KV + index K), sorted.
        index_source_layer_ids: layers that run the indexer (Full + Reindex), sorted.
        candidate_source_layer_id: the ratio-1 Full layer whose scores define the candidate pool
            (-1 = no pool); candidate_topk_blocks blocks of candidate_block_size positions.
        index_n_heads (HI), index_head_dim (DI), index_topk (TOPK): the lightning indexer.
    RoPE: rope_theta for ratio-0 layers (no YaRN); compress_rope_theta + rope_scaling (YaRN:
        factor, original_max_position_embeddings, beta_fast, beta_slow) for ratio > 0 layers.
    Norms: rms_norm_eps (statistics in fp32).
    FFN: MoE with n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
        routed_scaling_factor, scoring_func ("softmax" | "sigmoid" | "sqrtsoftplus"),
        swiglu_limit (0 = no clamp); n_routed_experts = 0 means a dense SwiGLU of
        intermediate_size. first_k_dense_replace: that many first layers use the dense FFN.
    Residual: hc_mult (1 = plain pre-norm residual; > 1 = mHC streams), hc_sinkhorn_iters, hc_eps.
    Engram: engram_layer_ids and engram_* fields (empty = none).
    kv_cache_dtype_main: "fp4" (V41_FP4, 288 B at D=512) or "fp8" (V41, 528 B).
    """

    vocab_size: int = 129280
    hidden_size: int = 5120
    num_hidden_layers: int = 40
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1280
    o_lora_rank: int = 1024
    o_groups: int = 8
    sliding_window: int = 128
    attn_softmax_scale: float | None = None
    compress_ratios: list = field(default_factory=list)
    kv_source_layer_ids: list = field(default_factory=list)
    index_source_layer_ids: list = field(default_factory=list)
    candidate_source_layer_id: int = -1
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 8
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-6
    intermediate_size: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    scoring_func: str = "softmax"
    norm_topk_prob: bool = True
    swiglu_limit: float = 0.0
    first_k_dense_replace: int = 0
    hc_mult: int = 1
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    engram_layer_ids: list = field(default_factory=list)
    engram_num_embeddings: list = field(default_factory=list)
    engram_max_ngram_size: int = 1
    engram_vocab_size: int = 0
    engram_n_heads: int = 0
    engram_head_dim: int = 0
    engram_pad_token_id: int = 2
    engram_compressed_vocab_size: int = 0
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    bos_token_id: int = 0
    eos_token_id: int = 1
    torch_dtype: str = "bfloat16"
    kv_cache_dtype_main: str = "fp4"
    quantization_config: dict | None = None
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, values: dict) -> DeepseekV41Config:
        """Build from a released `config.json` dict (text fields top level or in `text_config`)."""
        values = dict(values)
        text = values.pop("text_config", None)
        if isinstance(text, dict):
            values = {**values, **text}
        if "window_size" in values and "sliding_window" not in values:
            values["sliding_window"] = values["window_size"]
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in values.items() if k in names and k != "extra"}
        extra = {k: v for k, v in values.items() if k not in names}
        cfg = cls(**known, extra=extra)
        cfg.validate()
        return cfg

    @classmethod
    def from_hf(cls, path_or_dict: Any) -> DeepseekV41Config:
        """From a checkpoint directory, a `config.json` path, a dict or a transformers config."""
        if isinstance(path_or_dict, dict):
            return cls.from_dict(path_or_dict)
        if hasattr(path_or_dict, "to_dict"):
            return cls.from_dict(path_or_dict.to_dict())
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        extra = out.pop("extra")
        return {**extra, **out}

    # ------------------------------------------------------------------ derived
    @property
    def decoder_start(self) -> int:
        """First decoder layer (CED): the upper half of the stack."""
        return self.num_hidden_layers // 2

    @property
    def softmax_scale(self) -> float:
        return self.attn_softmax_scale or self.head_dim**-0.5

    @property
    def index_weight_scale(self) -> float:
        """The indexer's head-weight scale, DI^-0.5 HI^-0.5 (layers/indexer.py)."""
        return self.index_head_dim**-0.5 * self.index_n_heads**-0.5

    def ratio(self, layer: int) -> int:
        return int(self.compress_ratios[layer])

    def role(self, layer: int) -> str:
        if self.ratio(layer) == 0:
            return SWA
        kv, idx = layer in self.kv_source_layer_ids, layer in self.index_source_layer_ids
        if kv and idx:
            return FULL
        if idx:
            return REINDEX
        return REUSE

    def _nearest(self, ids, layer: int) -> int:
        r = self.ratio(layer)
        best = -1
        for s in ids:
            if s <= layer and self.ratio(s) == r:
                best = s
        return best

    def source_layer_of(self, layer: int) -> int:
        """The kv-source layer whose main KV / index K `layer` reads (itself for Full); -1 for
        SWA."""
        return -1 if self.ratio(layer) == 0 else self._nearest(self.kv_source_layer_ids, layer)

    def index_source_of(self, layer: int) -> int:
        """The index-source layer whose top-k `layer` uses (itself for Full/Reindex); -1 for SWA."""
        return -1 if self.ratio(layer) == 0 else self._nearest(self.index_source_layer_ids, layer)

    def uses_candidates(self, layer: int) -> bool:
        """Index sources after the candidate source score only the candidate pool."""
        return 0 <= self.candidate_source_layer_id < layer and layer in self.index_source_layer_ids

    def is_decoder(self, layer: int) -> bool:
        return layer >= self.decoder_start

    def roles(self) -> list:
        return [self.role(i) for i in range(self.num_hidden_layers)]

    @property
    def main_kv_layout(self):
        """The main-KV record layout: V41_FP4 (288 B at D = 512) or V41 (528 B) for "fp8"."""
        from sglang_dsv41.kv.records import Layout

        return Layout.V41_FP4 if self.kv_cache_dtype_main == "fp4" else Layout.V41

    # ------------------------------------------------------------------ bounded replay
    def replay_floor(self, prompt_len: int) -> int:
        """Decoder SWA bounded replay's floor for a prompt of `prompt_len` tokens: the first
        position the decoder computes, max(0, prompt_len - sliding_window) (docs/design.md 2.5)."""
        return max(0, int(prompt_len) - self.sliding_window)

    def replay_error(self, tail_at_last_kv_source: bool = False) -> ConfigError | None:
        """Why decoder SWA bounded replay cannot run on this config, or None (docs/design.md 2.5).

        The replay tail starts at the first decoder layer (`decoder_start`); only that layer
        takes its attention input over every row, so every kv source must be at or before it (a
        later one would compress the tail's rows only). tail_at_last_kv_source: the layer loop
        starts its tail at the last kv source instead (SGLang's in-tree loop, used by the CUDA
        model), so that source must be the first decoder layer itself, or the two tails differ.
        """
        last = max(self.kv_source_layer_ids, default=-1)
        if last > self.decoder_start:
            return config_error(
                "kv_source_layer_ids",
                f"bounded replay needs every kv source at or before the first decoder layer "
                f"{self.decoder_start}",
                last,
            )
        if tail_at_last_kv_source and last != self.decoder_start:
            return config_error(
                "kv_source_layer_ids",
                f"the last kv source is layer {last}; bounded replay in a layer loop whose tail "
                f"starts at the last kv source needs it at the first decoder layer "
                f"{self.decoder_start}",
            )
        return None

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ConfigError naming the field and layer of the first problem found
        (config_checks.py)."""
        validate_config(self)


def preset(name: str) -> DeepseekV41Config:
    """Named presets: `tiny` (CI), `small` (CPU demo), `flash` (V4.1-Flash attention geometry)."""
    from sglang_dsv41.presets import PRESETS

    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return DeepseekV41Config.from_dict(PRESETS[name]())
