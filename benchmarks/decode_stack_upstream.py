"""The peer of the decode-stack bench: one decode step in upstream's Hopper layout, and the
projections alone.

Used by benchmarks/bench_decode_stack.py beside `decode_stack.py` (ours, the served path). B
requests each hold `ctx` tokens and decode position ctx - 1; per layer i, with the layer math of
`layers/` (the same `MqaAttentionBase` layers as ours):

    h += attention_i(rms_norm(h))        (the FFN, mHC and Engram are not part of this step)

Layouts (`Caches.layout`):
    upstream  V4 584 B records for SWA and main KV, the same 68 B index K as ours; Reindex scores
              the whole context and then masks to the candidate pool (`reindex_whole_context`);
              attention: FlashMLA's SM90 legacy sparse decode (`flash_mla`, use_legacy=True).
              This package has no V4 record writer, so upstream's SWA / main-KV stores are timed
              as our fused V41 store of the same rows into a scratch buffer (one record per
              request and layer either way); its pools hold random V4 records.
    proj      the projections and layer math alone, no store, selection or attention (o = q):
              the part both layouts share.
Pools hold random valid records; each request's pages are shuffled through one pool (slot order
!= entry order), one token page table of P = 64 for every source (a ratio-r source keeps P / r
entries per page), FlashMLA's page block.
"""

from __future__ import annotations

import dataclasses

import torch
from decode_stack import random_records  # benchmarks/ is on sys.path (not a package)

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels import indexer as kidx
from sglang_dsv41.kernels.args import IndexerGeometry, PagedIndexK
from sglang_dsv41.kernels.dispatch import Path
from sglang_dsv41.kernels.indexer.ref import reindex_ref
from sglang_dsv41.kernels.kv_store import store_index_k, store_records, store_swa
from sglang_dsv41.kv.pages import slot_of
from sglang_dsv41.kv.records import Layout, record_bytes
from sglang_dsv41.layers.norm import rms_norm
from sglang_dsv41.tools.kv_capacity import v4_record_bytes

PAGE = 64  # tokens per page (and FlashMLA's page block of 64 records)
NEG_INF = float("-inf")
LAYOUTS = ("upstream", "proj")


@dataclasses.dataclass
class Batch:
    """B decode requests of ctx tokens each, decoding position ctx - 1.

    pos        int64 [B]     ctx - 1
    req        int32 [B]     page-table row of each request (arange)
    page_table int32 [B, ctx / P]  token pages, shuffled through n_pages pages
    swa_slots  int32 [B, W]  each request's window in every SWA cache, oldest first; the last
                             slot is this step's row
    swa_rows   rows of every SWA cache (a multiple of P)
    """

    ctx: int
    pos: torch.Tensor
    req: torch.Tensor
    page_table: torch.Tensor
    n_pages: int
    swa_slots: torch.Tensor
    swa_rows: int

    @property
    def size(self) -> int:
        return self.pos.shape[0]


def make_batch(B: int, ctx: int, window: int, device, seed: int = 0) -> Batch:
    if ctx % PAGE or ctx < window:
        raise ValueError(f"ctx must be a multiple of {PAGE} and >= the window, got {ctx}")
    g = torch.Generator(device=device).manual_seed(seed)
    pages = ctx // PAGE
    n_pages = -(-(B * pages + 1) // 2) * 2  # + a spare page; even: ratio-2 pools in 64-row blocks
    perm = torch.randperm(n_pages, device=device, generator=g)[: B * pages]
    swa_rows = -(-(2 * window * B) // PAGE) * PAGE
    swa = torch.randperm(swa_rows, device=device, generator=g)[: B * window]
    return Batch(
        ctx=ctx,
        pos=torch.full((B,), ctx - 1, dtype=torch.int64, device=device),
        req=torch.arange(B, dtype=torch.int32, device=device),
        page_table=perm.view(B, pages).int(),
        n_pages=n_pages,
        swa_slots=swa.view(B, window).int(),
        swa_rows=swa_rows,
    )


def entry_rows(cfg, batch: Batch, src: int) -> int:
    """Rows of a kv source's main-KV / index-K pool: P / ratio entries per page."""
    return batch.n_pages * (PAGE // cfg.ratio(src))


@dataclasses.dataclass
class Caches:
    """What one layout's step reads and writes.

    swa        per layer uint8 [swa_rows, 584] (None in `proj`)
    main       per kv source uint8 [rows, 584]
    index_k    per kv source uint8 [rows, 68]
    pending    per ratio-2 source fp32 [B, 2, D]: the request's unpaired (c, z)
    scratch    upstream: uint8 [B, 528], where its stand-in stores write
    fm_meta    upstream: one FlashMLA scheduler metadata per layer (None: no FlashMLA)
    candidates the candidate source's pool int32 [B, NB] of this step (set by its layer)
    """

    layout: str
    swa: list
    main: dict
    index_k: dict
    pending: dict
    scratch: torch.Tensor | None = None
    fm_meta: list | None = None
    candidates: torch.Tensor | None = None

    def nbytes(self) -> int:
        ts = [t for t in self.swa if t is not None] + list(self.main.values())
        ts += list(self.index_k.values()) + list(self.pending.values())
        return sum(t.numel() * t.element_size() for t in ts)


def make_caches(
    cfg: DeepseekV41Config, batch: Batch, layout: str, device, flashmla: bool = True, seed=2
) -> Caches:
    """A layout's caches; upstream without `flashmla` runs everything but attention (o = q),
    for the CPU dry run's plumbing only."""
    gen = torch.Generator(device=device).manual_seed(seed)
    L, D = cfg.num_hidden_layers, cfg.head_dim
    pending = {
        s: torch.randn(batch.size, 2, D, device=device, generator=gen)
        for s in cfg.kv_source_layer_ids
        if cfg.ratio(s) == 2
    }
    if layout == "proj":
        return Caches(layout, [None] * L, {}, {}, pending)
    rec = v4_record_bytes(cfg.head_dim, cfg.qk_rope_head_dim)
    ik = record_bytes(Layout.INDEX_K, cfg.index_head_dim)
    swa = [random_records(batch.swa_rows, rec, None, device, gen) for _ in range(L)]
    main, index_k = {}, {}
    for s in cfg.kv_source_layer_ids:
        main[s] = random_records(entry_rows(cfg, batch, s), rec, None, device, gen)
        index_k[s] = random_records(entry_rows(cfg, batch, s), ik, Layout.INDEX_K, device, gen)
    c = Caches(layout, swa, main, index_k, pending)
    c.scratch = torch.zeros(batch.size, record_bytes(Layout.V41, D), dtype=torch.uint8)
    c.scratch = c.scratch.to(device)
    if flashmla:
        import flash_mla

        c.fm_meta = [flash_mla.get_mla_metadata()[0] for _ in range(L)]
    return c


def reindex_whole_context(qI, w, kv: PagedIndexK, pool, geo: IndexerGeometry):
    """Upstream's Reindex: score every visible entry, mask outside pool [T, NB] block ids, top-k.

    int32 [T, topk] entry ids, -1 padded: the same set as kernels.indexer.reindex (ties aside).
    On the Triton path the whole-context scoring is our Full-layer scan (block maxima of every
    visible entry, kernels/indexer/ops.py); the mask and the top-k of the allowed blocks are
    torch, and only the chosen blocks are rescored, exactly as ops.full_topk restricted to the
    pool (generous to upstream, which writes and sorts the [T, N] logits). Elsewhere the torch
    reference (reindex_ref: the same mask-and-topk).
    """
    fast = {Path.TRITON: lambda: kidx.triton_unsupported(qI, kv, geo)}
    if dispatch.select("indexer.reindex_whole_context", qI.device, fast) is not Path.TRITON:
        return reindex_ref(qI, w, kv, pool, geo)
    from sglang_dsv41.kernels.indexer import ops

    bmax = ops.block_scores(qI, w, kv)  # [T, NBLK] fp32, -inf past the visible blocks
    T, nblk = bmax.shape
    col = torch.where(pool >= 0, pool.long(), torch.full_like(pool, nblk, dtype=torch.long))
    allowed = torch.zeros(T, nblk + 1, dtype=torch.bool, device=bmax.device)
    allowed.scatter_(1, col, True)
    masked = bmax.masked_fill(~allowed[:, :nblk], NEG_INF)
    vals, blocks = masked.topk(min(geo.topk, nblk), dim=1)  # [T, k]
    blocks = torch.where(vals > NEG_INF, blocks, torch.full_like(blocks, -1)).to(torch.int32)
    return ops.select_in_blocks(ops.pool_scores(qI, w, kv, blocks), blocks, geo.topk)


def _select(attn, cfg, i, xn, q_lora, batch: Batch, caches: Caches):
    """Index source i: top-k int32 [B, TOPK] entry ids (-1 padded) of its kv source."""
    src, geo, r = cfg.source_layer_of(i), IndexerGeometry.of(cfg), cfg.ratio(i)
    qI, w = attn.indexer.queries(q_lora, xn, batch.pos, attn.inv_freq)
    if caches.layout == "proj":
        return None
    kv = PagedIndexK(
        index_k=caches.index_k[src],
        page_table=batch.page_table,
        req_ids=batch.req,
        n_visible=((batch.pos + 1) // r).to(torch.int32),
        page_size=PAGE // cfg.ratio(src),
        split_pages=False,
    )
    if cfg.uses_candidates(i):
        return reindex_whole_context(qI, w, kv, caches.candidates, geo)
    if i == cfg.candidate_source_layer_id:
        out, caches.candidates = kidx.candidate_source(qI, w, kv, geo)
        return out
    return kidx.full_topk(qI, w, kv, geo)


def _compress(attn, cfg, i, xn, batch: Batch, caches: Caches) -> None:
    """Full layer i: the entry this step completes -> main KV and index K."""
    r = attn.ratio
    c, z = attn.compressor.project(xn)  # [B, D] fp32 each (z None at ratio 1)
    if r == 2:
        pend = caches.pending[i]
        latent = attn.compressor.pool(
            torch.stack((pend[:, 0], c), 1), torch.stack((pend[:, 1], z), 1)
        )
    else:
        latent = attn.compressor.pool(c[:, None], None)  # [B, D]
    k = attn.indexer.wk(latent.to(attn.indexer.wk.weight.dtype))  # [B, DI]
    if caches.layout == "proj":
        return
    entry = batch.pos // r
    dst = slot_of(batch.page_table, entry, batch.req, PAGE // r)  # [B]
    rope = dict(inv_freq=attn.inv_freq)
    ar = torch.arange(batch.size, device=xn.device)  # stand-in for the V4 record writer
    store_records(latent, caches.scratch, ar, Layout.V41, pos=entry * r, **rope)
    kn = attn.indexer.k_norm
    store_index_k(k, kn.weight, kn.eps, entry * r, caches.index_k[i], dst, **rope)


def _attend(attn, cfg, i, q, batch: Batch, caches: Caches, topk_slots) -> torch.Tensor:
    """FlashMLA's sparse decode of q bf16 [B, H, D]: o bf16 [B, H, D]."""
    import flash_mla

    main = None if topk_slots is None else caches.main[cfg.source_layer_of(i)]
    B, H, D = q.shape
    W, rec = batch.swa_slots.shape[1], caches.swa[i].shape[1]
    extra = {}
    if main is not None:
        extra = dict(
            extra_k_cache=main.view(-1, PAGE, 1, rec),
            extra_indices_in_kvcache=topk_slots.view(B, 1, -1),
        )
    out, _ = flash_mla.flash_mla_with_kvcache(
        q.view(B, 1, H, D),
        caches.swa[i].view(-1, PAGE, 1, rec),
        None,
        None,
        D,
        caches.fm_meta[i],
        softmax_scale=attn.scale,
        indices=batch.swa_slots.view(B, 1, W),
        attn_sink=attn.attn_sink,
        use_legacy=True,
        **extra,
    )
    return out.view(B, H, D)


def decode_step(cfg, layers: list, batch: Batch, caches: Caches, h):
    """One decode step of every layer: h bf16 [B, hidden] -> bf16 [B, hidden]."""
    pos, slots = batch.pos, {}
    ones = torch.ones(h.shape[1], device=h.device)
    for i, attn in enumerate(layers):
        xn = rms_norm(h, ones, cfg.rms_norm_eps)  # attn_norm (weight one)
        q, q_lora = attn.query(xn, pos)  # [B, H, D] fp32
        q = q.to(torch.bfloat16)
        kv = attn.wkv(xn)  # [B, D]
        if caches.layout != "proj":  # stand-in for the V4 record writer
            dst, n = torch.arange(batch.size, device=h.device), attn.kv_norm
            store_swa(kv, n.weight, n.eps, pos, caches.scratch, dst, inv_freq=attn.inv_freq)
        if attn.compressor is not None:
            _compress(attn, cfg, i, xn, batch, caches)
        if attn.indexer is not None:
            ids = _select(attn, cfg, i, xn, q_lora, batch, caches)
            if ids is not None:
                src = cfg.source_layer_of(i)
                req = batch.req[:, None].expand_as(ids).reshape(-1)
                flat = slot_of(batch.page_table, ids.reshape(-1), req, PAGE // cfg.ratio(src))
                slots[i] = flat.view(ids.shape).to(torch.int32)  # [B, TOPK]
        if caches.layout == "proj" or caches.fm_meta is None:
            o = q  # proj; or the dry run's upstream plumbing without FlashMLA (never timed)
        else:
            tk = slots[cfg.index_source_of(i)] if attn.ratio else None
            o = _attend(attn, cfg, i, q, batch, caches, tk)
        h = h + attn.output(o, pos).to(h.dtype)
    return h
