"""MqaAttentionBase: the V4.1 attention layer every role derives from.

Every layer owns its query path (wq_a -> q_norm -> wq_b, RoPE on the last R dims), its private SWA
KV path (wkv -> kv_norm -> RoPE, stored as V41 FP8), its sink logits and its grouped output
projection. The role-specific parts are attached from the config lists (docs/design.md 2.1):
    .compressor  kv sources (Full): main-KV latents (Compressor)
    .indexer     index sources (Full, Reindex): indexer queries, and keys for Full (Indexer)
Reuse layers have neither; SWA-only layers (ratio 0) have no global branch at all.
The cache-free math lives here; how keys are gathered (whole sequence or paged cache) is the
caller's business.

`attn_dtype` is the dtype the sparse attention reads its queries and writes its output in: None
(the default) keeps them in the compute dtype (fp32: the exact path); torch.bfloat16 rounds q on
the way in and o on the way out, as SGLang's V4 attention (FlashMLA) does. The serving option
`SGLANG_DSV41_ATTN_DTYPE` (sglang/options.py) sets it on a served model, `set_attention_dtype` on
any model (the oracle's switch, so that a bf16 server is compared with an oracle that rounds the
same way).
"""

import torch
from torch import nn

from sglang_dsv41.config import FULL, DeepseekV41Config
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.dtypes import compute_dtype
from sglang_dsv41.layers.indexer import Indexer
from sglang_dsv41.layers.linear import Linear, stable_linear
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.rope import apply_rope, rope_inv_freq


class MqaAttentionBase(nn.Module):
    attn_dtype: torch.dtype | None = None

    def __init__(self, cfg: DeepseekV41Config, layer: int):
        super().__init__()
        self.cfg, self.layer_id = cfg, layer
        self.role, self.ratio = cfg.role(layer), cfg.ratio(layer)
        H, D, hid = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        self.n_heads, self.head_dim = H, D
        self.o_groups, self.o_lora_rank = cfg.o_groups, cfg.o_lora_rank
        self.scale = cfg.softmax_scale
        self.wq_a = Linear(hid, cfg.q_lora_rank)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = Linear(cfg.q_lora_rank, H * D)
        self.wkv = Linear(hid, D)
        self.kv_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.attn_sink = nn.Parameter(torch.zeros(H, dtype=torch.float32))
        self.wo_a = Linear(H * D // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank)
        self.wo_b = Linear(cfg.o_groups * cfg.o_lora_rank, hid)
        self.compressor = Compressor(cfg, layer) if self.role == FULL else None
        is_index = layer in cfg.index_source_layer_ids and self.ratio > 0
        self.indexer = Indexer(cfg, layer, owns_keys=self.role == FULL) if is_index else None
        self.register_buffer("inv_freq", rope_inv_freq(cfg, self.ratio), persistent=False)

    @property
    def compute_dtype(self) -> torch.dtype:
        """Queries, attention and its output are fp32, or fp64 in a float64 model (the twin
        check, tools/twin_check.py); record values are fp32 before quantization either way."""
        return compute_dtype(self.wq_b.weight)

    def query(self, x: torch.Tensor, pos: torch.Tensor):
        """x [T, hidden], pos [T] -> (q [T, H, D] with RoPE, in compute_dtype; q_lora)."""
        q_lora = self.q_norm(self.wq_a(x))
        q = self.wq_b(q_lora).to(self.compute_dtype).view(-1, self.n_heads, self.head_dim)
        return apply_rope(q, pos, self.inv_freq), q_lora

    def attention_in(self, q: torch.Tensor) -> torch.Tensor:
        """q [T, H, D] as the sparse attention reads it: unchanged, or in attn_dtype."""
        return q if self.attn_dtype is None else q.to(self.attn_dtype)

    def attention_out(self, o: torch.Tensor) -> torch.Tensor:
        """o [T, H, D] as the sparse attention writes it: unchanged, or rounded to attn_dtype."""
        return o if self.attn_dtype is None else o.to(self.attn_dtype)

    def swa_kv(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], pos [T] -> SWA key/value fp32 [T, D] before V41 quantization."""
        kv = self.kv_norm(self.wkv(x)).float()
        return apply_rope(kv, pos, self.inv_freq)

    def main_kv(self, latent: torch.Tensor, entry_pos: torch.Tensor) -> torch.Tensor:
        """latent [n, D] -> main KV fp32 [n, D] with RoPE at the entries' positions (pre-quant)."""
        return apply_rope(latent.float(), entry_pos, self.inv_freq)

    def output(self, o: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """o [T, H, D] attention output -> [T, hidden]: inverse RoPE, grouped wo_a, wo_b."""
        o = apply_rope(o.to(self.compute_dtype), pos, self.inv_freq, inverse=True)
        T, G, R = o.shape[0], self.o_groups, self.o_lora_rank
        og = o.reshape(T, G, -1).to(self.wo_a.weight.dtype)  # [T, G, H*D/G]
        wa = self.wo_a.weight.view(G, R, -1)  # [G, R, H*D/G]
        z = torch.cat([stable_linear(og[:, g], wa[g]) for g in range(G)], dim=1)  # [T, G*R]
        return self.wo_b(z)


ATTN_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
"""The attention I/O modes by name: fp32 = the compute dtype (exact), bf16 = rounded."""


def set_attention_dtype(model: nn.Module, dtype: torch.dtype | None) -> int:
    """Set attn_dtype on every attention layer of `model` (None turns rounding off); returns how
    many layers it set."""
    if dtype not in ATTN_DTYPES.values():
        raise ValueError(f"attention dtype {dtype}: one of {list(ATTN_DTYPES.values())}")
    layers = [m for m in model.modules() if isinstance(m, MqaAttentionBase)]
    for m in layers:
        m.attn_dtype = dtype
    return len(layers)
