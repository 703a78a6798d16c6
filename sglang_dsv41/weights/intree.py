"""SGLang's in-tree V4 parameters seen under this package's dense names, dequantized.

`dense_view(model)` maps every parameter of a loaded in-tree `DeepseekV4ForCausalLM` (as its
`load_weights` leaves them, before SGLang's post-load kernel layouts) to the dense tensors our
loader produces (`weights.checkpoint.load_release_state`), in fp32:

    in-tree                                        dense (ours)
    model.embed_tokens / lm_head / model.norm      embed / head / norm
    layers.i.input_ / post_attention_layernorm     layers.i.attn_norm / ffn_norm
    self_attn.wqkv_a (FP8, rows q | kv)            attn.wq_a, attn.wkv   (or separate wq_a, wkv)
    self_attn.{wq_b, wo_b, indexer.wq_b} (FP8)     attn.{...}
    self_attn.wo_a (BF16, dequantized at load)     attn.wo_a
    self_attn.compressor.wkv_gate (rows kv | gate) attn.compressor.wkv, wgate (or separate)
    mlp.gate.weight / e_score_correction_bias      ffn.gate.weight / bias
    mlp.experts.w13_weight[e] (FP4, rows w1 | w3)  ffn.experts.e.w1, w3;  w2_weight[e] -> w2
    mlp.shared_experts.gate_up_proj (FP8, w1 | w3) ffn.shared_experts.w1, w3;  down_proj -> w2
    engram.embed (FP8 rows) / engram.wkv (FP8)     engram.embed / engram.wkv
    everything else (norms, sinks, mHC, engram q/k weights)   the same name under layers.i
FP8 blocks dequantize as e4m3 * scale per 32 x 32 block (`weight_scale_inv` holds the scale,
not its inverse), FP4 as e2m1 * scale per row per 32 columns. The test that pins this map
(tests/cpu/test_intree_weights.py) requires every in-tree parameter to be read exactly once.
"""

from __future__ import annotations

import torch

from sglang_dsv41.kv.fp import e2m1_decode, unpack_nibbles

IGNORED = ("attn_mqa.k_scale", "attn_mqa.v_scale")
"""In-tree parameters with no checkpoint tensor (KV-cache scales of the unused RadixAttention)."""


def dequant_block(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FP8 e4m3 [N, K] + fp32 [ceil(N/bn), ceil(K/bk)] block scales -> fp32 [N, K]."""
    N, K = weight.shape
    bn, bk = -(-N // scale.shape[0]), -(-K // scale.shape[1])
    s = scale.float().repeat_interleave(bn, 0)[:N].repeat_interleave(bk, 1)[:, :K]
    return weight.float() * s


def dequant_fp4_rows(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 int8 [N, K/2] + scales [N, K/32] (fp32 or UE8M0) -> fp32 [N, K]."""
    values = e2m1_decode(unpack_nibbles(weight.view(torch.uint8)))  # [N, K]
    return values * scale.float().repeat_interleave(32, 1)


class _Reader:
    """Reads parameters by in-tree name and records which were read. Names with duplicates
    included: a module may also be reachable under another path (SGLang's non-CUDA decoder
    layers link `_next_layer`), and only identity says whether a parameter was read."""

    def __init__(self, model):
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.read = set()

    def __call__(self, name: str) -> torch.Tensor:
        p = self.params[name]
        self.read.add(id(p))
        return p.data

    def has(self, name: str) -> bool:
        return name in self.params

    def fp8(self, prefix: str) -> torch.Tensor:
        w = self(prefix + ".weight")
        if w.dtype != torch.float8_e4m3fn:
            return w.float()
        return dequant_block(w, self(prefix + ".weight_scale_inv"))

    def unread(self) -> list:
        left = {}
        for n, p in self.params.items():
            if id(p) not in self.read and not n.endswith(IGNORED):
                left.setdefault(id(p), n)
        return sorted(left.values())


def _attention(get: _Reader, src: str, dst: str, cfg, out: dict) -> None:
    if get.has(src + "wqkv_a.weight"):
        wqkv = get.fp8(src + "wqkv_a")
        out[dst + "wq_a.weight"], out[dst + "wkv.weight"] = wqkv.split(
            [cfg.q_lora_rank, cfg.head_dim]
        )
    else:
        out[dst + "wq_a.weight"], out[dst + "wkv.weight"] = (
            get.fp8(src + "wq_a"),
            get.fp8(src + "wkv"),
        )
    for name in ("wq_b", "wo_a", "wo_b"):
        out[dst + name + ".weight"] = get.fp8(src + name)
    for name in ("q_norm.weight", "kv_norm.weight", "attn_sink"):
        out[dst + name] = get(src + name).float()
    c = src + "compressor."
    if get.has(c + "norm.weight"):
        out[dst + "compressor.norm.weight"] = get(c + "norm.weight").float()
        if get.has(c + "wkv_gate.weight"):
            kv, gate = get(c + "wkv_gate.weight").float().chunk(2)
            out[dst + "compressor.wkv.weight"], out[dst + "compressor.wgate.weight"] = kv, gate
        else:
            out[dst + "compressor.wkv.weight"] = get(c + "wkv.weight").float()
            if get.has(c + "wgate.weight"):
                out[dst + "compressor.wgate.weight"] = get(c + "wgate.weight").float()
    x = src + "indexer."
    if get.has(x + "weights_proj.weight"):
        out[dst + "indexer.wq_b.weight"] = get.fp8(x + "wq_b")
        out[dst + "indexer.weights_proj.weight"] = get(x + "weights_proj.weight").float()
        for name in ("wk.weight", "k_norm.weight"):
            if get.has(x + name):
                out[dst + "indexer." + name] = get(x + name).float()


def _ffn(get: _Reader, src: str, dst: str, out: dict) -> None:
    out[dst + "gate.weight"] = get(src + "gate.weight").float()
    out[dst + "gate.bias"] = get(src + "gate.e_score_correction_bias").float()
    e = src + "experts."
    w13, s13 = get(e + "w13_weight"), get(e + "w13_weight_scale_inv")
    w2, s2 = get(e + "w2_weight"), get(e + "w2_weight_scale_inv")
    inter = w13.shape[1] // 2
    for j in range(w13.shape[0]):
        w1w3 = dequant_fp4_rows(w13[j], s13[j])
        out[f"{dst}experts.{j}.w1.weight"] = w1w3[:inter]
        out[f"{dst}experts.{j}.w3.weight"] = w1w3[inter:]
        out[f"{dst}experts.{j}.w2.weight"] = dequant_fp4_rows(w2[j], s2[j])
    s = src + "shared_experts."
    gate_up = get.fp8(s + "gate_up_proj")
    out[dst + "shared_experts.w1.weight"], out[dst + "shared_experts.w3.weight"] = gate_up.chunk(2)
    out[dst + "shared_experts.w2.weight"] = get.fp8(s + "down_proj")


def _engram(get: _Reader, src: str, dst: str, out: dict) -> None:
    w, s = get(src + "embed.weight"), get(src + "embed.scale")
    rows = w.float().view(w.shape[0], -1, 32) * s.float()[..., None]  # [R, D/32, 32]
    out[dst + "embed.weight"] = rows.view(w.shape)
    out[dst + "wkv.weight"] = get.fp8(src + "wkv")
    for name in ("q_weight", "k_weight"):
        out[dst + name] = get(src + name).float()


def dense_view(model, cfg) -> tuple[dict, list]:
    """(dense name -> fp32 tensor, in-tree parameter names not read) of a loaded in-tree model.

    model: SGLang's DeepseekV4ForCausalLM (or a subclass) right after `load_weights`;
    cfg: this package's DeepseekV41Config of the same checkpoint.
    """
    get, out = _Reader(model), {}
    out["embed.weight"] = get("model.embed_tokens.weight").float()
    out["norm.weight"] = get("model.norm.weight").float()
    out["head.weight"] = get("lm_head.weight").float()
    for i in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        out[dst + "attn_norm.weight"] = get(src + "input_layernorm.weight").float()
        out[dst + "ffn_norm.weight"] = get(src + "post_attention_layernorm.weight").float()
        for part in ("attn", "ffn"):
            for kind in ("fn", "base", "scale"):
                name = f"hc_{part}_{kind}"
                if get.has(src + name):
                    out[dst + name] = get(src + name).float()
        _attention(get, src + "self_attn.", dst + "attn.", cfg, out)
        _ffn(get, src + "mlp.", dst + "ffn.", out)
        if get.has(src + "engram.embed.weight"):
            _engram(get, src + "engram.", dst + "engram.", out)
    return out, get.unread()
