"""Per-forward batch metadata of the cached path: which rows belong to which request.

A forward batch (extend, decode or mixed) is a list of B requests; request b contributes rows at
consecutive positions [prefix_b, seq_b). `Rows` is a subset of the batch's rows (bounded replay
drops decoder rows below a request's floor); `ids` points back at the batch rows, so what source
layers hand their consumers (`ForwardShared`) is indexed by batch row from any subset.
`PoolWindow` and `RingPlan` say where a part's SWA layers read and write their window records;
stores.py builds them on the part's first such layer and every other one reuses them.
Every tensor lives on the pool's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from sglang_dsv41.kernels.sparse_attn import swa_window_slots
from sglang_dsv41.layers.rope import RopeAngles, rope_cos_sin
from sglang_dsv41.layers.window import swa_window

if TYPE_CHECKING:
    from sglang_dsv41.kernels.args import DecodedRecords
    from sglang_dsv41.layers.protocols import Attention
    from sglang_dsv41.serving.buffers import RecordBuffers
    from sglang_dsv41.serving.prefix_replay import Fold


@dataclass
class Rows:
    """ids int64 [T] batch row ids; pos int64 [T]; req int64 [T] request index in the batch.
    Rows of one request are consecutive and in position order."""

    ids: torch.Tensor
    pos: torch.Tensor
    req: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.ids.numel())

    def select(self, keep: torch.Tensor) -> Rows:
        """keep bool [T] (per request a suffix of its rows) -> the kept rows."""
        idx = keep.nonzero().flatten()
        return Rows(self.ids[idx], self.pos[idx], self.req[idx])

    def first_of_request(self) -> torch.Tensor:
        """int64 [T]: index (into these rows) of the first row of each row's request."""
        T, dev = self.n, self.pos.device
        t = torch.arange(T, device=dev)
        start = torch.ones(T, dtype=torch.bool, device=dev)
        start[1:] = self.req[1:] != self.req[:-1]
        return torch.cummax(torch.where(start, t, torch.zeros_like(t)), 0).values

    def last_row(self) -> torch.Tensor:
        """int64 [T]: index (into these rows) of the last row of each row's request."""
        T, dev = self.n, self.pos.device
        t = torch.arange(T, device=dev)
        at_end = torch.where(self.last_of_request(), t, torch.full_like(t, T))
        return torch.flip(torch.cummin(torch.flip(at_end, [0]), 0).values, [0])

    def last_of_request(self) -> torch.Tensor:
        """bool [T]: the row is its request's last row among these rows."""
        last = torch.ones(self.n, dtype=torch.bool, device=self.pos.device)
        last[:-1] = self.req[1:] != self.req[:-1]
        return last


@dataclass
class PoolWindow:
    """Where SWA-pool layers read and write in one forward: slots int32 [T, W], each row's
    window as SWA slots (-1 outside); dst int64 [T], the rows' own SWA slots. Positions below a
    resumed request's resume point are rows of its replay window (RecordBuffers.replay_row):
    the replay segment's SWA, which no other request reads."""

    slots: torch.Tensor
    dst: torch.Tensor

    @classmethod
    def of(
        cls, rows: Rows, ctx: BatchContext, pool: RecordBuffers, W: int, floor: torch.Tensor
    ) -> PoolWindow:
        rp = ctx.req_pool[rows.req]  # [T]
        full = swa_window_slots(ctx.req_to_token, rp, rows.pos, W, floor)  # [T, W]
        slots = pool.swa_slot_of(full)
        dst = pool.swa_slot_of(ctx.out_loc[rows.ids])
        if ctx.resume is not None:
            resume = ctx.resume[rows.req]  # [T]
            kpos, _ = swa_window(rows.pos, W)  # [T, W], the positions of `full`
            replayed = (kpos < resume[:, None]) & (full >= 0)
            slots = torch.where(replayed, pool.replay_row(rp[:, None], kpos), slots)
            dst = torch.where(rows.pos < resume, pool.replay_row(rp, rows.pos), dst)
        return cls(slots.to(torch.int32), dst)


@dataclass
class RingPlan:
    """Where ring layers read and write in one forward (rows and floors are the same for each).
    Rings hold Wr >= W records (buffers.py: W plus a verify's slack).

    slots     int32 [T, W]: each row's window in the scratch buffer [Bn Wr + T, B] (the batch's
              rings, request b's position p at b Wr + p % Wr, then this forward's rows), -1
              outside
    new_rows  int64 [T]: 0..T-1, the rows' records in the scratch's tail
    keep_slot int64 [T]: the request slot whose ring keeps the row (each request's last Wr rows
              of this forward), 0 (padding) for the others
    ring_pos  int64 [T]: position % Wr
    """

    slots: torch.Tensor
    new_rows: torch.Tensor
    keep_slot: torch.Tensor
    ring_pos: torch.Tensor

    @classmethod
    def of(
        cls, rows: Rows, ctx: BatchContext, W: int, floor: torch.Tensor, Wr: int | None = None
    ) -> RingPlan:
        Wr = W if Wr is None else Wr
        Bn, T = ctx.batch_size, rows.n
        first = rows.first_of_request()  # [T]
        kpos, ok = swa_window(rows.pos, W, floor)  # [T, W]
        p0 = rows.pos[first]
        in_fwd = kpos >= p0[:, None]
        slots = torch.where(
            in_fwd,
            Bn * Wr + first[:, None] + kpos - p0[:, None],
            rows.req[:, None] * Wr + kpos % Wr,
        )
        slots = torch.where(ok, slots, torch.full_like(slots, -1)).to(torch.int32)
        rp = ctx.req_pool[rows.req]
        keep = rows.pos > rows.pos[rows.last_row()] - Wr
        keep_slot = torch.where(keep, rp, torch.zeros_like(rp))
        new_rows = torch.arange(T, device=rows.pos.device)
        return cls(slots, new_rows, keep_slot, rows.pos % Wr)


@dataclass
class PartShared:
    """What is the same for every layer of one part within a forward: the encoder layers, or the
    decoder layers (from cfg.decoder_start on; their rows may be a replay subset). The layers of
    a part see the same rows and floors.

    swa_window    the SWA-pool layers' window slots and destinations (PoolWindow)
    ring_plan     the ring layers' reads and writes (RingPlan; decoder, replay on)
    rope_swa, rope_compressed   RopeAngles of the part's rows for each kind of layer (inv_freq
                  depends only on whether the layer compresses: layers.rope.rope_inv_freq)
    topk_decoded  index source layer -> the top-k records of the part's rows decoded once (CPU:
                  kernels.args.DecodedRecords, serving.attention.topk_decoded)
    """

    swa_window: PoolWindow | None = None
    ring_plan: RingPlan | None = None
    rope_swa: RopeAngles | None = None
    rope_compressed: RopeAngles | None = None
    topk_decoded: dict[int, DecodedRecords] = field(default_factory=dict)


@dataclass
class ForwardShared:
    """What source layers hand their consumers within one forward (rows = batch rows).

    topk        index source layer -> int64 [T_batch, TOPK] entry ids, -1 padded
    topk_slots  index source layer -> int32 [T, TOPK] rows of its kv source's main-KV buffer for
                the rows that read it (-1 padded); the source's Reuse layers read the same
    candidates  int32 [T_batch, NB] candidate pool block ids of the candidate source (-1 padded)
    page_table  int32 [B, n_pages] page ids of the batch's requests (serving.attention)
    encoder, decoder   what the layers of each part share (PartShared; `part`)
    """

    topk: dict[int, torch.Tensor] = field(default_factory=dict)
    topk_slots: dict[int, torch.Tensor] = field(default_factory=dict)
    candidates: torch.Tensor | None = None
    page_table: torch.Tensor | None = None
    encoder: PartShared = field(default_factory=PartShared)
    decoder: PartShared = field(default_factory=PartShared)

    def part(self, attn: Attention) -> PartShared:
        """The shared state of the layer's part (decoder from cfg.decoder_start on)."""
        return self.decoder if attn.cfg.is_decoder(attn.layer_id) else self.encoder

    def angles(self, attn: Attention, rows: Rows) -> RopeAngles:
        """RoPE angles of `rows` under the layer's inv_freq, computed once per forward for each
        part and kind of layer (PartShared)."""
        part = self.part(attn)
        if attn.ratio:
            if part.rope_compressed is None:
                part.rope_compressed = RopeAngles(*rope_cos_sin(rows.pos, attn.inv_freq))
            return part.rope_compressed
        if part.rope_swa is None:
            part.rope_swa = RopeAngles(*rope_cos_sin(rows.pos, attn.inv_freq))
        return part.rope_swa


@dataclass
class BatchContext:
    """Everything the cached attention needs about one forward batch.

    rows: the batch rows; req_pool int64 [B] request slots; req_to_token int32 [R, ctx] the
    slot table (token position -> full slot); seq_lens int64 [B] lengths after this forward;
    table_len the positions per request that page tables cover (host int: the longest sequence
    of the batch, or the slot table's width under CUDA graphs); floors int64 [B] decoder SWA
    floor per request (bounded replay; 0 = full forward); out_loc int64 [T] full slots of the
    batch rows; replaying: some row lies below its request's floor (host flag, set for extend
    batches; decode rows never do); max_slots: `slots_bound` of the batch (host int, set for
    extend batches), the bound that sizes a prefill's attention workspace without a host sync
    (kernels.args.SparseKV.max_slots); resume int64 [B]: the request's prefix resume point M
    (positions below it read and write SWA in its replay window; 0 = none) and swa_floors
    int64 [B] the SWA floor of the pool layers, replay_floor(M) (None: no request resumes;
    docs/design.md 2.8); fold: the replay rows this forward adds in front of SGLang's rows
    (serving.prefix_replay.Fold; None: none).
    """

    rows: Rows
    req_pool: torch.Tensor
    req_to_token: torch.Tensor
    seq_lens: torch.Tensor
    table_len: int
    floors: torch.Tensor
    out_loc: torch.Tensor
    replaying: bool = False
    max_slots: int | None = None
    resume: torch.Tensor | None = None
    swa_floors: torch.Tensor | None = None
    fold: Fold | None = None
    shared: ForwardShared = field(default_factory=ForwardShared)

    @property
    def batch_size(self) -> int:
        return int(self.req_pool.numel())

    def row_floors(self, rows: Rows) -> torch.Tensor:
        return self.floors[rows.req]

    def row_swa_floors(self, rows: Rows) -> torch.Tensor:
        """int64 [T]: the SWA floor of the SWA-pool layers for each row (0 without resumes)."""
        if self.swa_floors is None:
            return torch.zeros_like(rows.pos)
        return self.swa_floors[rows.req]


def slots_bound(seq_lens) -> int:
    """An upper bound on the distinct cache slots one layer's sparse attention reads in a batch
    whose requests hold seq_lens tokens after this forward (host ints or a CPU tensor): request
    r's window slots are one per position (at most seq_r), and its top-k entries index its
    own compressed entries (at most one per position, ratio >= 1), so 2 sum(seq_r)."""
    return 2 * int(sum(int(s) for s in seq_lens))


def build_rows(prefix_lens: list, extend_lens: list, device="cpu") -> Rows:
    """Rows of a batch whose request b covers positions [prefix_b, prefix_b + extend_b)."""
    ext = torch.tensor(extend_lens, dtype=torch.int64)
    pre = torch.tensor(prefix_lens, dtype=torch.int64)
    return rows_from_lens(pre.to(device), ext.to(device), int(ext.sum()))


def rows_from_lens(prefix: torch.Tensor, extend: torch.Tensor, total: int) -> Rows:
    """Device version of build_rows: prefix, extend int64 [B]; total = sum(extend) (host int,
    known to the caller without a sync)."""
    dev = prefix.device
    b = torch.arange(extend.numel(), device=dev)
    req = torch.repeat_interleave(b, extend, output_size=total)  # [T]
    start = torch.cumsum(extend, 0) - extend  # [B]
    ids = torch.arange(total, device=dev)
    return Rows(ids, prefix[req] + ids - start[req], req)


def decode_context(
    req_pool: torch.Tensor,
    seq_lens: torch.Tensor,
    out_loc: torch.Tensor,
    req_to_token: torch.Tensor,
    floors: torch.Tensor,
    table_len: int,
    resume: torch.Tensor | None = None,
) -> BatchContext:
    """The context of a decode batch (one new token per request) from its device tensors alone:
    no host sync, static shapes, so it can be built inside a CUDA graph capture.
    req_pool, seq_lens (after this step), out_loc int64 [B]; floors, resume int64 [B]."""
    B = seq_lens.numel()
    rows = rows_from_lens(seq_lens - 1, torch.ones_like(seq_lens), B)
    return BatchContext(
        rows, req_pool, req_to_token, seq_lens, table_len, floors, out_loc, resume=resume
    )


def verify_context(
    req_pool: torch.Tensor,
    prefix_lens: torch.Tensor,
    width: int,
    out_loc: torch.Tensor,
    req_to_token: torch.Tensor,
    floors: torch.Tensor,
    table_len: int,
    resume: torch.Tensor | None = None,
) -> BatchContext:
    """The context of a target-verify batch (speculative decoding): `width` rows per request at
    positions [prefix_b, prefix_b + width), causal within the block, from device tensors alone
    (no host sync, static shapes: CUDA-graph capturable like decode_context). req_pool,
    prefix_lens (committed lengths before this forward) int64 [B]; out_loc int64 [B width];
    floors int64 [B]. Some of the rows will be rejected: buffers.py says why the pool needs no
    undo."""
    B = prefix_lens.numel()
    rows = rows_from_lens(prefix_lens, torch.full_like(prefix_lens, width), B * width)
    seq_lens = prefix_lens + width
    return BatchContext(
        rows, req_pool, req_to_token, seq_lens, table_len, floors, out_loc, resume=resume
    )
