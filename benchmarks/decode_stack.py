"""One decode step of the whole V4.1 attention stack through the served path (ours).

Used by benchmarks/bench_decode_stack.py (its peer, upstream's Hopper layout, is
`decode_stack_upstream.py`). B requests each hold `ctx` tokens and decode position ctx - 1 (so
every ratio-2 source completes an entry this step: the costlier of its two steps). The step is
the served code end to end: `serving.context.decode_context` (built from device tensors, as the
backend's in-graph metadata), `serving.layer_loop.run_layers`, and per layer
`serving.attention.attention_layer` with its stores, windows (`PoolWindow`, or the decoder's rings
with replay on), selection and attention, over a `serving.buffers.RecordBuffers` pool with
SGLang's slot table and full -> SWA mapping laid out as its allocators would. The layers are
`MqaAttentionBase` with random bf16 weights; the FFN, mHC and Engram are left out of the loop
(`AttentionOnly`), so each layer does

    h += attention_i(attn_norm(h))

    every layer   q = wq_b(q_norm(wq_a x)) + RoPE; SWA row wkv x -> V41 store (kv_norm, RoPE)
    Full          compressor (ratio 2 pairs the request's pending token) -> V41_FP4 main-KV
                  store; wk(latent) -> index-K store (k_norm, RoPE)
    Full/Reindex  indexer queries and weights; Full scan, candidate source (its own top-k and
                  the block pool) or Reindex over the pool
    all but SWA   sparse attention over the SWA window + the index source's top-k of the kv
                  source's main KV (mapped once per index source, reused by the Reuse layers);
                  SWA-only layers over the window alone; then inverse RoPE, grouped wo_a, wo_b
Pools hold random valid records (finite values, scales in a normal range); each request's pages
are shuffled through the pool (slot order != entry order) and its window's SWA slots through
the SWA pool.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.kernels import indexer as kidx
from sglang_dsv41.kv.records import Layout
from sglang_dsv41.layers.attention import MqaAttentionBase, set_attention_dtype
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.residual import PlainResidual
from sglang_dsv41.serving.buffers import RecordBuffers
from sglang_dsv41.serving.context import decode_context
from sglang_dsv41.serving.layer_loop import run_layers

PAGE = 64  # the served pool's page size here (SGLang's --page-size)


def build_layers(cfg: DeepseekV41Config, device, dtype=torch.bfloat16) -> list:
    """Every attention layer of cfg with random weights: Linear weights in dtype (default init,
    U(+-in^-1/2)), norms at one, sinks N(0, 1) fp32."""
    layers = []
    g = torch.Generator(device=device).manual_seed(0)
    for i in range(cfg.num_hidden_layers):
        with torch.device(device):
            attn = MqaAttentionBase(cfg, i)
        for m in attn.modules():
            if isinstance(m, nn.Linear):
                m.to(dtype)
        with torch.no_grad():
            attn.attn_sink.copy_(torch.randn(attn.n_heads, generator=g, device=device))
        layers.append(attn.requires_grad_(False))
    return layers


def layers_bytes(layers: list) -> int:
    return sum(p.numel() * p.element_size() for a in layers for p in a.parameters())


# byte range of a record's scales and the range of scale bytes written there (valid, moderate)
_SCALES = {
    Layout.V41: lambda n: (n - n // 33, n, 118, 128),  # UE8M0 2^-9 .. 2^0
    Layout.V41_FP4: lambda n: (n * 8 // 9, n, 0x20, 0x40),  # e4m3 2^-7 .. 2^0
    Layout.INDEX_K: lambda n: (n * 16 // 17, n, 122, 132),  # UE8M0 2^-5 .. 2^4
}


def fill_records(t: torch.Tensor, layout: Layout | None, gen) -> torch.Tensor:
    """Fill uint8 [..., nbytes] records in place: value bytes < 0x70 (finite e4m3 / e2m1 codes),
    scale bytes of `layout` in a moderate range. V4 records (layout None): every byte < 0x3C,
    so any reading of a byte (e4m3, UE8M0, the high byte of a bf16 or fp32) is finite and at
    most 2: FlashMLA's output over them stays finite."""
    nbytes = t.shape[-1]
    t.random_(0, 0x70 if layout is not None else 0x3C, generator=gen)
    if layout is Layout.INDEX_K:
        t[..., : nbytes * 16 // 17].random_(0, 256, generator=gen)
    if layout is not None:
        a, b, lo, hi = _SCALES[layout](nbytes)
        t[..., a:b].random_(lo, hi, generator=gen)
    return t


def random_records(rows: int, nbytes: int, layout: Layout | None, device, gen) -> torch.Tensor:
    """uint8 [rows, nbytes] of random valid records (`fill_records`)."""
    t = torch.empty(rows, nbytes, dtype=torch.uint8, device=device)
    return fill_records(t, layout, gen)


class AttentionOnly(PlainResidual):
    """The pre-norm residual with the FFN left out: the served loop then does
    h += attn(attn_norm(h)) per layer and nothing else."""

    def ffn_input(self, state, block):
        return None

    def ffn_done(self, state, block, y):
        return state


class Block(nn.Module):
    """A layer of the attention-only stack: its attention and attn_norm (weight one)."""

    def __init__(self, attn: MqaAttentionBase, eps: float):
        super().__init__()
        self.attn, self.attn_norm = attn, RMSNorm(attn.cfg.hidden_size, eps)

    @staticmethod
    def ffn(x):
        return None


class StackModel(nn.Module):
    """What `run_layers` reads of a model, around the attention layers: an embedding of B random
    rows (the step's input h0 = embed(arange(B))), the blocks, the final norm, the residual and
    the head's dtype (no head is applied)."""

    def __init__(self, cfg: DeepseekV41Config, layers: list, rows: int, device, dtype):
        super().__init__()
        self.cfg = cfg
        with torch.device(device):
            self.embed = nn.Embedding(rows, cfg.hidden_size).to(dtype).requires_grad_(False)
            self.layers = nn.ModuleList(Block(a, cfg.rms_norm_eps) for a in layers)
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.head = nn.Linear(cfg.hidden_size, 1, bias=False).to(dtype)
        self.requires_grad_(False)
        self.residual, self.engram_hasher = AttentionOnly(), None


@dataclasses.dataclass
class ServedStack:
    """A decode batch on the served path: B requests in request slots 1..B of `pool`, each with
    ctx tokens in the slot table `r2t` int32 [B + 1, ctx] (row 0 padding), decoding position
    ctx - 1 at full slot out_loc. `step()` is one forward (no host sync: CUDA-graph safe)."""

    model: StackModel
    pool: RecordBuffers
    r2t: torch.Tensor
    ids: torch.Tensor
    req_pool: torch.Tensor
    seq_lens: torch.Tensor
    out_loc: torch.Tensor

    @property
    def size(self) -> int:
        return self.ids.numel()

    def step(self) -> torch.Tensor:
        """One decode step: final normed h [B, hidden] in the weights' dtype."""
        ctx = decode_context(
            self.req_pool,
            self.seq_lens,
            self.out_loc,
            self.r2t,
            self.pool.floor[self.req_pool],
            self.r2t.shape[1],
        )
        return run_layers(self.model, self.ids, ctx, self.pool)

    def nbytes(self) -> int:
        """The pool's buffers, the slot table and the full -> SWA mapping."""
        m = self.pool.full_to_swa_index_mapping
        return self.pool.nbytes() + self.r2t.numel() * 4 + m.numel() * m.element_size()


def served_stack(
    model: StackModel,
    B: int,
    ctx: int,
    device,
    page: int = PAGE,
    replay: bool = False,
    attn_dtype: torch.dtype | None = torch.bfloat16,
    seed: int = 0,
) -> ServedStack:
    """B requests of ctx tokens on a fresh pool of random records: token pages shuffled through
    the full slots (page 0 is SGLang's padding page), each request's last W positions mapped to
    SWA slots shuffled through the SWA pool (the others unmapped, as after SGLang's eviction);
    with `replay` the decoder layers' SWA lives in request rings (floors 0). The layers' sparse
    attention reads and writes attn_dtype (bf16: FlashMLA's I/O; None: fp32, the exact path)."""
    cfg = model.cfg
    W = cfg.sliding_window
    if ctx % page or ctx < W:
        raise ValueError(f"ctx must be a multiple of the page {page} and >= the window, got {ctx}")
    set_attention_dtype(model, attn_dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    pages = ctx // page
    full_slots = (B * pages + 1) * page
    swa_slots = -(-(2 * W * B) // page) * page
    pool = RecordBuffers(cfg, replay, full_slots, swa_slots, page, B, device)
    perm = torch.randperm(B * pages, device=device, generator=g) + 1  # page 0: padding
    j = torch.arange(ctx, device=device)
    r2t = torch.zeros(B + 1, ctx, dtype=torch.int32, device=device)
    r2t[1:] = (perm.view(B, pages)[:, j // page] * page + j % page).int()
    mapping = torch.zeros(full_slots + page + 1, dtype=torch.int64, device=device)
    swa = torch.randperm(swa_slots, device=device, generator=g)[: B * W] + page  # 0: none
    mapping[r2t[1:, ctx - W :].reshape(-1).long()] = swa
    pool.register_mapping(mapping)
    for t in pool.swa:
        if t is not None:
            fill_records(t, Layout.V41, g)
    for t in pool.ring.values():
        fill_records(t, Layout.V41, g)
    for s in pool.main:
        fill_records(pool.main[s], cfg.main_kv_layout, g)
        fill_records(pool.index_k[s], Layout.INDEX_K, g)
    for t in pool.pending.values():
        t.normal_(generator=g)
    req_pool = torch.arange(1, B + 1, device=device)
    return ServedStack(
        model=model,
        pool=pool,
        r2t=r2t,
        ids=torch.arange(B, device=device),
        req_pool=req_pool,
        seq_lens=torch.full((B,), ctx, dtype=torch.int64, device=device),
        out_loc=r2t[1:, ctx - 1].long(),
    )


@contextlib.contextmanager
def reindex_trace(whole_context):
    """Within the block, every Reindex call of the served path (`kernels.indexer.reindex`) also
    runs `whole_context(qI, w, kv, pool, geo)` on the same inputs; yields the list of
    (pooled top-k, whole-context top-k, pool) per call, in layer order."""
    calls, inner = [], kidx.reindex

    def traced(qI, w, kv, pool, geo):
        out = inner(qI, w, kv, pool, geo)
        calls.append((out, whole_context(qI, w, kv, pool, geo), pool))
        return out

    kidx.reindex = traced
    try:
        yield calls
    finally:
        kidx.reindex = inner
