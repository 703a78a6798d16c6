"""RecordBuffers: the storage of the cached path (pure torch; SGLang's pool derives from it).

    swa[layer]     uint8 [S_swa + P, 528]  V41 SWA records by SWA slot (layers in the SWA pool;
                                           None for ring layers)
    ring[layer]    uint8 [R + 1, Wr, 528]  decoder layers with replay on: a request's last Wr SWA
                                           records, position p at p % Wr
    main[src]      uint8 [(S + P) / r, 288 | 528]  kv sources only (V41_FP4, or V41 on request)
    index_k[src]   uint8 [(S + P) / r, 68]         kv sources only
    pending[src]   fp32 [R + 1, K, 2, D]   ratio-2 sources: (c, z) of a request's even-position
                                           tokens, entry e at e % K (`dtype`: float64 for the
                                           twin check)
    floor          int64 [R + 1]           decoder SWA floor of the request in each slot
                                           (bounded replay; at least swa_floor)
    resume         int64 [R + 1]           prefix resume: the cached prefix length M whose SWA
                                           the request replays (0 = none; docs/design.md 2.8)
    swa_floor      int64 [R + 1]           SWA floor of the pool layers: replay_floor(M), or 0
    engram_tail    int64 [R + 1, n - 1]    Engram: the n - 1 token ids before the request's next
                                           position (Engram models only)
With prefix replay on, every swa[layer] carries (R + 1) W rows more after its S_swa + P: request
slot r's replay window, position p of its replay segment [replay_floor(M), M) at row
S_swa + P + r W + p % W (`replay_row`); the segment's SWA records (approximate, rebuilt by the
replay) stay private to the request and never reach a slot the radix cache shares.
S = full (token) slots, S_swa = SWA slots, P = page size, R = request slots (row 0 = padding),
Wr = W + verify_width - 1 and K = verify_width // 2 + 1 (PoolGeometry; W and 1 without
speculative decoding).

Rolled-back rows (speculative decoding): a target verify writes gamma + 1 rows per request and
keeps only the accepted ones; SGLang keeps their slots reserved and the next forward restarts at
the committed length. Records at slots are rewritten there before any row reads them, and the
per-request state is position-addressed with slack (Wr, K) so that a rejected row only writes
ring records and pairs that no later row reads before rewriting them: nothing needs undoing.
A ratio-r entry j of a request is stored at row full_slot(j r) // r: with an even page size the
two tokens of a ratio-2 entry share a page, so that row is the page's.

SWA slots: a token's SWA record lives at `swa_slot_of(full_slot)`, through SGLang's
full -> SWA mapping (`full_to_swa_index_mapping`, registered by its SWA allocator, which frees a
slot once it leaves every live window); without a mapping SWA slots are the full slots.

Why rings under replay: decoder SWA written under bounded replay depends on the request's floor
and is absent below it, so it must never be read through a slot that SGLang's radix cache may
remap onto another request's identical tokens (an insert dedupes a running request's slots onto
the cached ones). With the radix match capped at the floor a request computes every decoder row
it reads; keeping those rows in its own ring makes that independent of slot sharing
(tests/cpu/test_serving_pool.py shows the remap). Buffers are zero-filled, so a masked-out read
never meets NaN.
"""

from __future__ import annotations

import collections

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.serving.geometry import PoolGeometry


class RecordBuffers:
    def __init__(
        self,
        cfg: DeepseekV41Config,
        replay: bool,
        full_slots: int,
        swa_slots: int,
        page_size: int,
        max_requests: int,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        verify_width: int = 1,
        prefix_replay: bool = False,
    ):
        g = PoolGeometry(cfg, replay, verify_width, prefix_replay)
        if page_size % 2 and any(cfg.ratio(s) == 2 for s in g.kv_sources):
            raise ValueError(
                f"dsv41 pool: page_size {page_size} must be even (ratio-2 entries pair the two "
                "tokens of one page)"
            )
        self.cfg, self.geometry, self.replay = cfg, g, replay
        self.full_slots, self.swa_slots, self.page = full_slots, swa_slots, page_size
        self.max_requests = max_requests
        z = dict(dtype=torch.uint8, device=device)
        swa_layers, R = set(g.swa_layers), max_requests + 1
        self.replay_base = swa_slots + page_size  # first replay-window row of swa[layer]
        rows = self.replay_base + (R * cfg.sliding_window if prefix_replay else 0)
        self.swa = [
            torch.zeros(rows, g.swa_record, **z) if i in swa_layers else None
            for i in range(cfg.num_hidden_layers)
        ]
        self.ring = {i: torch.zeros(R, g.ring_width, g.swa_record, **z) for i in g.ring_layers}
        self.main, self.index_k, self.pending = {}, {}, {}
        for s in g.kv_sources:
            n = g.entries(full_slots + page_size, s)
            self.main[s] = torch.zeros(n, g.main_record, **z)
            self.index_k[s] = torch.zeros(n, g.index_record, **z)
            if cfg.ratio(s) == 2:
                shape = (R, g.pending_slots, 2, cfg.head_dim)
                self.pending[s] = torch.zeros(shape, dtype=dtype, device=device)
        self.floor = torch.zeros(R, dtype=torch.int64, device=device)
        self.resume = torch.zeros(R, dtype=torch.int64, device=device)
        self.swa_floor = torch.zeros(R, dtype=torch.int64, device=device)
        self.prefix_replay = prefix_replay
        self.engram_tail = torch.full(
            (R, g.engram_tail_len()), -1, dtype=torch.int64, device=device
        )
        self.full_to_swa_index_mapping = None  # set by register_mapping (SGLang's allocator)
        self._starts = collections.deque()  # thread-safe append / popleft

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """int64 [S + P + 1] full slot -> SWA slot (0 = none), owned by SGLang's allocator."""
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def swa_slot_of(self, full_slots: torch.Tensor) -> torch.Tensor:
        """int [...] full slots (-1 = none) -> int64 SWA slots (-1 stays -1)."""
        full = full_slots.long()
        m = self.full_to_swa_index_mapping
        if m is None:
            return full
        return torch.where(full >= 0, m[full.clamp_min(0)], full)

    def source_layer_of(self, layer: int) -> int:
        """The kv source whose main KV / index K `layer` reads (itself for Full, -1 for SWA)."""
        return self.cfg.source_layer_of(layer)

    def entry_rows(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Buffer rows of the entries whose first token sits at full `slots` (int64 [...])."""
        return slots // self.cfg.ratio(layer)

    def replay_row(self, req_slot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """int64 rows of swa[layer] holding request slot `req_slot`'s SWA record of position
        `pos` in its replay window (broadcasting int tensors)."""
        W = self.cfg.sliding_window
        return self.replay_base + req_slot.long() * W + pos.long() % W

    def start_request(
        self, slot: int, floor: int, tail: list, resume: int = 0, fold: list | None = None
    ) -> None:
        """A request (re)starts prefilling in request slot `slot`: its decoder replay floor,
        for Engram the n - 1 token ids before its first row (-1 before position 0), and its
        prefix resume M (0 = none); fold: the ids of the replay segment [replay_floor(M), M)
        when this forward replays it (its first prefill), else None.

        Queued, and written by `apply_starts` when the next batch's metadata is built: SGLang's
        scheduler calls this from its own thread while forwards run on another CUDA stream, so a
        write from here would race the forward that reads the slot."""
        if resume and not self.prefix_replay:
            raise ValueError("dsv41 pool: a prefix resume needs the pool's replay windows")
        self._starts.append((slot, floor, list(tail), int(resume), fold))

    def apply_starts(self) -> dict:
        """Write the queued request starts (in the stream of the forward about to run).
        Returns {request slot: replay segment ids} of the requests whose replay this forward
        runs (serving.prefix_replay.fold_batch)."""
        folds = {}
        while self._starts:
            slot, floor, tail, resume, fold = self._starts.popleft()
            swa_floor = self.cfg.replay_floor(resume) if resume else 0
            self.floor[slot] = max(floor, swa_floor)
            self.resume[slot] = resume
            self.swa_floor[slot] = swa_floor
            if self.engram_tail.shape[1]:
                self.engram_tail[slot] = torch.tensor(tail, dtype=torch.int64)
            if fold is not None:
                if len(fold) != resume - swa_floor:
                    raise ValueError(
                        f"dsv41 pool: replay of {len(fold)} ids, not [{swa_floor}, {resume})"
                    )
                folds[slot] = list(fold)
        return folds

    def tensors(self) -> list:
        bufs = [b for b in self.swa if b is not None] + list(self.ring.values())
        bufs += list(self.main.values()) + list(self.index_k.values())
        bufs += list(self.pending.values()) + [self.floor, self.engram_tail]
        return bufs + [self.resume, self.swa_floor]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.tensors())
