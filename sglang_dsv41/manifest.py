"""The checkpoint's tensor manifest: every tensor name with its shape and dtype
(docs/design.md 2.7).

One definition shared by `tools.make_checkpoint` (what to write) and the loaders (what to expect).
Names follow the released checkpoint (`layers.{i}.attn.wq_a.weight`, ...). Dtypes here are the
dense (unquantized) format: `dense_dtype` for matrices and norms, fp32 for `attn_sink` and the
router bias.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import FULL, REINDEX, DeepseekV41Config


def attention_tensors(cfg: DeepseekV41Config, i: int) -> dict:
    """name -> shape for layer i's attention (prefix `layers.{i}.attn.`)."""
    H, D, hid = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    G, R = cfg.o_groups, cfg.o_lora_rank
    out = {
        "wq_a.weight": (cfg.q_lora_rank, hid),
        "q_norm.weight": (cfg.q_lora_rank,),
        "wq_b.weight": (H * D, cfg.q_lora_rank),
        "wkv.weight": (D, hid),
        "kv_norm.weight": (D,),
        "attn_sink": (H,),
        "wo_a.weight": (G * R, H * D // G),
        "wo_b.weight": (hid, G * R),
    }
    role = cfg.role(i)
    if role == FULL:
        out["compressor.wkv.weight"] = (D, hid)
        if cfg.ratio(i) == 2:
            out["compressor.wgate.weight"] = (D, hid)
        out["compressor.norm.weight"] = (D,)
        out["indexer.wk.weight"] = (cfg.index_head_dim, D)
        out["indexer.k_norm.weight"] = (cfg.index_head_dim,)
    if role in (FULL, REINDEX):
        out["indexer.wq_b.weight"] = (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
        out["indexer.weights_proj.weight"] = (cfg.index_n_heads, hid)
    return out


def ffn_tensors(cfg: DeepseekV41Config, i: int) -> dict:
    """name -> shape for layer i's FFN (prefix `layers.{i}.ffn.`)."""
    hid = cfg.hidden_size
    if cfg.n_routed_experts and i >= cfg.first_k_dense_replace:
        E, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
        out = {"gate.weight": (E, hid), "gate.bias": (E,)}
        for e in range(E):
            out.update(
                {
                    f"experts.{e}.w1.weight": (inter, hid),
                    f"experts.{e}.w2.weight": (hid, inter),
                    f"experts.{e}.w3.weight": (inter, hid),
                }
            )
        if cfg.n_shared_experts:
            s = inter * cfg.n_shared_experts
            out.update(
                {
                    "shared_experts.w1.weight": (s, hid),
                    "shared_experts.w2.weight": (hid, s),
                    "shared_experts.w3.weight": (s, hid),
                }
            )
        return out
    inter = cfg.intermediate_size
    return {"w1.weight": (inter, hid), "w2.weight": (hid, inter), "w3.weight": (inter, hid)}


def layer_extra_tensors(cfg: DeepseekV41Config, i: int) -> dict:
    """name -> shape for layer i's mHC parameters (hc_mult > 1) and Engram (prefix `layers.{i}.`).

    mHC: hc_{attn,ffn}_fn [(2+S)*S, S*hidden], _base [(2+S)*S], _scale [3] (fp32).
    Engram: embed.weight [rows, head_dim], wkv.weight [(S+1)*hidden, (n-1)*heads*head_dim],
    q_weight, k_weight [S, hidden].
    """
    S, d, out = cfg.hc_mult, cfg.hidden_size, {}
    if S > 1:
        w = (2 + S) * S
        for sub in ("attn", "ffn"):
            out.update(
                {f"hc_{sub}_fn": (w, S * d), f"hc_{sub}_base": (w,), f"hc_{sub}_scale": (3,)}
            )
    if i in cfg.engram_layer_ids:
        j = list(cfg.engram_layer_ids).index(i)
        cols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
        out.update(
            {
                "engram.embed.weight": (cfg.engram_num_embeddings[j], cfg.engram_head_dim),
                "engram.wkv.weight": ((S + 1) * d, cols * cfg.engram_head_dim),
                "engram.q_weight": (S, d),
                "engram.k_weight": (S, d),
            }
        )
    return out


FP32_SUFFIXES = (
    "attn_sink",
    "gate.bias",
    "hc_attn_fn",
    "hc_attn_base",
    "hc_attn_scale",
    "hc_ffn_fn",
    "hc_ffn_base",
    "hc_ffn_scale",
)


def tensor_manifest(cfg: DeepseekV41Config, dense_dtype=torch.float32) -> dict:
    """Full name -> (shape, dtype) for the dense checkpoint format."""
    shapes = {
        "embed.weight": (cfg.vocab_size, cfg.hidden_size),
        "norm.weight": (cfg.hidden_size,),
        "head.weight": (cfg.vocab_size, cfg.hidden_size),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (cfg.hidden_size,)
        shapes[p + "ffn_norm.weight"] = (cfg.hidden_size,)
        shapes.update({p + "attn." + k: v for k, v in attention_tensors(cfg, i).items()})
        shapes.update({p + "ffn." + k: v for k, v in ffn_tensors(cfg, i).items()})
        shapes.update({p + k: v for k, v in layer_extra_tensors(cfg, i).items()})
    return {
        n: (tuple(s), torch.float32 if n.endswith(FP32_SUFFIXES) else dense_dtype)
        for n, s in shapes.items()
    }
