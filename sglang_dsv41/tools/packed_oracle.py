"""The oracle for a released checkpoint too large to hold dense: routed experts stay packed.

`load_packed_oracle(path, device)` builds `ReferenceModel` with every tensor but the routed
experts dequantized to fp32 on `device` (as `from_pretrained` does), and each MoE's routed experts
kept as the checkpoint stores them (packed e2m1 + UE8M0 scales, 0.53 bytes per weight) and
dequantized one expert at a time, for the tokens routed to it, in `PackedMoE.forward`. The math is
`layers.ffn`'s: the same `Gate`, each expert an `Expert` built over its dequantized weights, the
shared experts the block's own. flash-slice's 384-expert layers take 44 GiB on the GPU this way
instead of 326 GiB of fp32.

`score_continuations` is the oracle's side of `tools.agreement`: with the served numerics
switched on (`reference.act_quant.quantize_fp8_linear_inputs`, bf16 attention queries and output
unless SGLANG_DSV41_ATTN_DTYPE=fp32) and each prompt's generation replay floor, one forward over
prompt + continuation gives the teacher-forced top-1 and the deficit of every continuation token.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.dtypes import compute_dtype, upcast
from sglang_dsv41.layers.ffn import MoE
from sglang_dsv41.weights.quant import dequant_fp4_packed
from sglang_dsv41.weights.release_manifest import scale_name

EXPERT = "layers.{i}.ffn.experts.{e}.{w}.weight"


class PackedMoE(nn.Module):
    """A MoE whose routed experts are packed FP4 [E, N, K/2] int8 + UE8M0 [E, N, K/32]."""

    def __init__(self, moe: MoE, packed: dict, limit: float):
        super().__init__()
        self.gate, self.shared_experts = moe.gate, moe.shared_experts
        self.packed = packed  # "w1" / "w2" / "w3" -> (weights [E, ...], scales [E, ...])
        self.limit = limit

    def expert(self, e: int) -> nn.Module:
        from sglang_dsv41.layers.ffn import Expert

        w1 = self.dense("w1", e)
        inter, hid = w1.shape
        with torch.device("meta"):
            ex = Expert(hid, inter, self.limit)
        ex.load_state_dict(
            {f"{w}.weight": self.dense(w, e) if w != "w1" else w1 for w in ("w1", "w2", "w3")},
            assign=True,
        )
        return ex

    def dense(self, w: str, e: int) -> torch.Tensor:
        q, s = self.packed[w]
        return dequant_fp4_packed(q[e], s[e])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]: `layers.ffn.MoE`'s per-expert path (host sync)."""
        w, idx = self.gate(x)
        out = torch.zeros(x.shape, dtype=compute_dtype(x), device=x.device)
        for e in torch.unique(idx).tolist():
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            y = upcast(self.expert(e)(x[tok])) * w[tok, slot, None]
            out.index_add_(0, tok, y)
        if self.shared_experts is not None:
            out += upcast(self.shared_experts(x))
        return out.to(x.dtype)


def load_packed_oracle(path: str, device, dtype=torch.float32):
    """ReferenceModel of the released checkpoint at `path` on `device`, experts packed."""
    from sglang_dsv41.layers.engram import build_engram_hasher
    from sglang_dsv41.layers.residual import build_residual
    from sglang_dsv41.layers.rope import rope_inv_freq
    from sglang_dsv41.reference.model import ReferenceModel
    from sglang_dsv41.weights.checkpoint import (
        dense_from_release,
        scan_checkpoint,
        shard_reader,
        validate_release,
    )
    from sglang_dsv41.weights.release_manifest import FP32, release_kind, release_manifest

    cfg = DeepseekV41Config.from_hf(path)
    found, where = scan_checkpoint(path)
    validate_release(found, cfg, path)
    get = shard_reader(where)

    with torch.device("meta"):
        model = ReferenceModel(cfg)
    state = {}
    for name in release_manifest(cfg):
        if name.endswith((".scale", ".gate.bias_vl")) or ".ffn.experts." in name:
            continue
        t = dense_from_release(name, get)
        state[name] = (t.float() if release_kind(name) == FP32 else t.to(dtype)).to(device)
    for i, block in enumerate(model.layers):
        if not isinstance(block.ffn, MoE):
            continue
        packed = {}
        for w in ("w1", "w2", "w3"):
            names = [EXPERT.format(i=i, e=e, w=w) for e in range(cfg.n_routed_experts)]
            packed[w] = tuple(
                torch.stack([get(f(n)) for n in names]).to(device)
                for f in (lambda n: n, scale_name)
            )
        block.ffn = PackedMoE(block.ffn, packed, cfg.swiglu_limit)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"{path}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.residual = build_residual(cfg)
    model.engram_hasher = build_engram_hasher(cfg, path)
    for block in model.layers:
        block.attn.inv_freq = rope_inv_freq(cfg, block.attn.ratio)
    return model.to(device).eval()  # raises if a tensor were left on the meta device


@torch.no_grad()
def score_continuations(
    path: str, ps: list, conts: list, device: str = "cuda", served_numerics: bool = True
) -> list:
    """Per prompt {"top1": [...], "deficit": [...]}: the oracle's teacher-forced view of conts.
    served_numerics: the CUDA model's switches (module docstring); off for the pure-torch
    model that serves on CPU (fp32 throughout)."""
    model = load_packed_oracle(path, torch.device(device))
    if served_numerics:
        from sglang_dsv41.layers.attention import set_attention_dtype
        from sglang_dsv41.reference.act_quant import quantize_fp8_linear_inputs
        from sglang_dsv41.sglang import options

        quantize_fp8_linear_inputs(model)
        set_attention_dtype(model, options.attn_dtype(options.INTREE_ATTN_DEFAULT))
    rows = []
    for p, c in zip(ps, conts, strict=True):
        ids = torch.tensor(p + c, dtype=torch.int64, device=device)
        floor = model.replay_floor_for(len(p), True)
        logits = model.forward(ids, replay_floor=floor)[len(p) - 1 : len(p) + len(c) - 1]
        lp = torch.log_softmax(logits.double(), -1)  # [len(c), vocab]
        tok = torch.tensor(c, device=lp.device)
        deficit = lp.max(-1).values - lp.gather(1, tok[:, None])[:, 0]
        rows.append({"top1": lp.argmax(-1).tolist(), "deficit": deficit.clamp(min=0).tolist()})
    return rows
