"""The DSpark draft head a V4.1 checkpoint carries: its `dspark_*` config keys and tensor manifest.

SGLang 0.5.23 reads a bundled DSpark head from the target checkpoint itself when the config holds
any of the prefixed keys below (`dspark_config.checkpoint_bundles_dspark_draft`), builds
`DeepseekV4ForCausalLMDSpark` from the same config.json and loads every `mtp.*` tensor through
`_remap_dspark_weight_name` (docs/speculative.md has the walk-through). The keys:

    dspark_block_size        gamma, the draft tokens per block (verify width gamma + 1)
    dspark_markov_rank       rank of the Markov head (> 0 required)
    dspark_noise_token_id    the mask token the draft block is filled with (embedded only)
    dspark_target_layer_ids  the target layers whose attention input (mean over the mHC streams)
                             feeds the draft; one draft stage per entry
Names and meanings are SGLang's parser's; the values the release's own config.json sets are not
published with SGLang, so the presets' values are chosen (`dspark_config`): 3 stages and blocks of
5 draft tokens (what DeepSeek states for V4.1), a rank of hidden / 16 (at least 8), the last token
id as the mask token, target layers spread evenly over the stack.

Tensors (prefix `mtp.{k}.`, stage k of S = len(dspark_target_layer_ids)); each stage is a V4
decoder layer whose attention is SWA only (compress ratio 0: no compressor, no indexer):

    attn_norm.weight, ffn_norm.weight            [hidden]
    attn.{wq_a, q_norm, wq_b, wkv, kv_norm, attn_sink, wo_a, wo_b}   as a target layer's
    ffn.{gate, experts.{e}.w1/w2/w3, shared_experts.w1/w2/w3}        as a MoE layer's
    hc_{attn,ffn}_{fn,base,scale}                mHC (hc_mult > 1)
  stage 0 only:
    main_proj.weight      [hidden, hidden * S]   the captured target states -> draft width
    main_norm.weight      [hidden]
  last stage only:
    norm.weight           [hidden]
    markov_head.embed.weight  [vocab, rank]      SGLang's markov_w1 (previous token -> latent)
    markov_head.head.weight   [vocab, rank]      SGLang's markov_w2 (latent -> logit bias)
    confidence_head.proj.weight [1, hidden + rank]  read when SGLANG_RAGGED_VERIFY_MODE is not
                                                 static (its default skips it)
No `hc_head_*`: V4.1 collapses the streams with the last FFN's pre-mix. The draft shares the
target's embedding and LM head. Released format: the same quantization rules as the target's
layers (`release_manifest.release_entries`), plus `main_proj` FP8 with a 32x32-block scale (SGLang
builds it as a quantized ReplicatedLinear); the Markov and confidence heads are stored FP32 (an
assumption: SGLang keeps markov_w2 and the confidence projection in fp32).
Imports torch, never sglang.
"""

from __future__ import annotations

import dataclasses

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.manifest import FP32_SUFFIXES, attention_tensors, ffn_tensors, layer_extra_tensors
from sglang_dsv41.weights.release_manifest import FP8, FP32, release_entries, release_kind

PREFIX = "mtp."
KEYS = (
    "dspark_block_size",
    "dspark_markov_rank",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
)
STAGES, BLOCK_SIZE = 3, 5
_STAGE_ATTN = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "attn_sink", "wo_a", "wo_b")
_FP32_HEADS = ("markov_head.embed.weight", "markov_head.head.weight", "confidence_head.proj.weight")


@dataclasses.dataclass(frozen=True)
class DSparkHead:
    """The draft head's geometry, read from a config's `dspark_*` keys."""

    block_size: int
    markov_rank: int
    noise_token_id: int
    target_layer_ids: tuple

    @property
    def stages(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def of(cls, cfg: DeepseekV41Config) -> DSparkHead | None:
        """The head `cfg` declares (None without `dspark_*` keys); raises ValueError naming the
        key when one is missing or out of range."""
        values = {k: cfg.extra.get(k) for k in KEYS}
        if all(v is None for v in values.values()):
            return None
        for k, v in values.items():
            if v is None:
                raise ValueError(f"{k}: missing (a DSpark head needs all of {', '.join(KEYS)})")
        head = cls(
            int(values["dspark_block_size"]),
            int(values["dspark_markov_rank"]),
            int(values["dspark_noise_token_id"]),
            tuple(int(x) for x in values["dspark_target_layer_ids"]),
        )
        if head.block_size < 1 or head.markov_rank < 1 or not head.target_layer_ids:
            raise ValueError(
                f"dspark_block_size {head.block_size}, dspark_markov_rank {head.markov_rank}, "
                f"dspark_target_layer_ids {list(head.target_layer_ids)}: need >= 1, >= 1, non-empty"
            )
        if not 0 <= head.noise_token_id < cfg.vocab_size:
            raise ValueError(
                f"dspark_noise_token_id {head.noise_token_id}: outside the vocabulary "
                f"[0, {cfg.vocab_size})"
            )
        bad = [i for i in head.target_layer_ids if not 0 <= i < cfg.num_hidden_layers]
        if bad:
            raise ValueError(
                f"dspark_target_layer_ids: {bad} outside the {cfg.num_hidden_layers} layers"
            )
        return head


def dspark_config(text: dict, stages: int = STAGES, block_size: int = BLOCK_SIZE) -> dict:
    """The `dspark_*` keys this package's presets add to a text config dict (the rules of the
    module docstring)."""
    n, hidden, vocab = text["num_hidden_layers"], text["hidden_size"], text["vocab_size"]
    return {
        "dspark_block_size": block_size,
        "dspark_markov_rank": max(8, hidden // 16),
        "dspark_noise_token_id": vocab - 1,
        "dspark_target_layer_ids": [(k + 1) * n // (stages + 1) for k in range(stages)],
    }


def _moe_layer(cfg: DeepseekV41Config) -> int:
    moe = [i for i in range(cfg.num_hidden_layers) if i >= cfg.first_k_dense_replace]
    if not cfg.n_routed_experts or not moe:
        raise ValueError("dspark: the draft stages are MoE layers; the config has no MoE layer")
    return moe[-1]


def dspark_shapes(cfg: DeepseekV41Config) -> dict:
    """Dense name -> shape of every DSpark tensor `cfg` declares ({} without a head)."""
    head = DSparkHead.of(cfg)
    if head is None:
        return {}
    stage_cfg = cfg
    n_routed = cfg.extra.get("dspark_n_routed_experts")
    if n_routed:
        stage_cfg = dataclasses.replace(cfg, n_routed_experts=int(n_routed))
    hid, S = cfg.hidden_size, head.stages
    attn = {k: v for k, v in attention_tensors(cfg, 0).items() if k.split(".")[0] in _STAGE_ATTN}
    ffn = ffn_tensors(stage_cfg, _moe_layer(cfg))
    hc = {k: v for k, v in layer_extra_tensors(cfg, 0).items() if k.startswith("hc_")}
    out = {}
    for k in range(S):
        p = f"{PREFIX}{k}."
        out[p + "attn_norm.weight"] = (hid,)
        out[p + "ffn_norm.weight"] = (hid,)
        out.update({p + "attn." + n: s for n, s in attn.items()})
        out.update({p + "ffn." + n: s for n, s in ffn.items()})
        out.update({p + n: s for n, s in hc.items()})
    first, last = f"{PREFIX}0.", f"{PREFIX}{S - 1}."
    out[first + "main_proj.weight"] = (hid, hid * S)
    out[first + "main_norm.weight"] = (hid,)
    out[last + "norm.weight"] = (hid,)
    out[last + "markov_head.embed.weight"] = (cfg.vocab_size, head.markov_rank)
    out[last + "markov_head.head.weight"] = (cfg.vocab_size, head.markov_rank)
    out[last + "confidence_head.proj.weight"] = (1, hid + head.markov_rank)
    return {n: tuple(s) for n, s in out.items()}


def dspark_tensors(cfg: DeepseekV41Config, dense_dtype=torch.float32) -> dict:
    """Dense format: name -> (shape, dtype) of the DSpark tensors (fp32 for sinks, router biases,
    mHC and the Markov / confidence heads; `dense_dtype` otherwise)."""
    return {
        n: (s, torch.float32 if n.endswith(FP32_SUFFIXES + _FP32_HEADS) else dense_dtype)
        for n, s in dspark_shapes(cfg).items()
    }


def dspark_release_kind(name: str) -> str:
    """Storage kind of a dense DSpark tensor name (release_manifest's kinds): the target
    layers' rules, main_proj FP8, the Markov and confidence heads FP32."""
    if name.endswith("main_proj.weight"):
        return FP8
    if name.endswith(_FP32_HEADS):
        return FP32
    return release_kind(name)


def dspark_release_tensors(cfg: DeepseekV41Config) -> dict:
    """Released format: stored name -> (shape, dtype) of the DSpark tensors, scales included."""
    out = {}
    for name, shape in dspark_shapes(cfg).items():
        out.update(release_entries(name, shape, dspark_release_kind(name)))
        if name.endswith(".ffn.gate.bias"):
            out[name + "_vl"] = (shape, torch.float32)
    return out
