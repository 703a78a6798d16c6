"""The one byte calculator of the serving KV pool (no sglang, no tensors).

The pool has three kinds of storage, each priced here once; `RecordBuffers` allocates exactly
these bytes, the server's pool sizing budgets them, its startup log prints them and
`tools.kv_report` reports them.

    full slots  one per token of context (SGLang's token slots). Per kv source, one main-KV
                record (V41_FP4 288 B, or V41 528 B) and one index-K record (68 B) per
                compressed entry, 1/ratio entries per token: the global state, 890 B/token on
                V4.1-Flash.
    SWA slots   window-bounded (SGLang's hybrid SWA pool frees a slot once it leaves every live
                window): one V41 record (528 B) per layer whose SWA lives there. With decoder
                bounded replay on these are the encoder layers only.
    request     per request slot: the fp32 pair (c, z) of each ratio-2 source's unpaired token,
    slots       the decoder SWA rings with replay on (a window of V41 records per decoder layer,
                see buffers.py for why), with prefix replay a replay window (a window of V41
                records per SWA-pool layer, docs/design.md 2.8), the Engram n-gram tail, the
                floors and the resume point; plus the slot table row SGLang allocates per
                request slot (int32 per position of context).
SGLang's hybrid SWA allocator also keeps an int64 full -> SWA mapping entry per full slot
(MAPPING_BYTES); `total_bytes` charges it with the buffers.
Buffers carry one page more than their slot count (slot 0 is SGLang's padding slot), and one
request slot more (row 0 is padding).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.kv.records import Layout, record_bytes

MAPPING_BYTES = 8  # SGLang's full -> SWA mapping: int64 per full slot


@dataclass(frozen=True)
class PoolGeometry:
    """verify_width: the most rows per request a forward may hold before some are rolled back
    (speculative decoding's target verify: gamma + 1; 1 without speculation). Per-request state
    is position-addressed with that much slack, so rows a verify rejects are never read: the
    rings hold `ring_width` records, the ratio-2 pairs `pending_slots` (buffers.py)."""

    cfg: DeepseekV41Config
    replay: bool = False
    verify_width: int = 1
    prefix_replay: bool = False

    def __post_init__(self):
        if self.verify_width < 1:
            raise ValueError(f"verify_width {self.verify_width}: must be >= 1")

    @property
    def ring_width(self) -> int:
        """Records per decoder SWA ring: the window plus verify_width - 1 rows that a verify may
        write past a request's committed length."""
        return self.cfg.sliding_window + self.verify_width - 1

    @property
    def pending_slots(self) -> int:
        """(c, z) pairs kept per ratio-2 source and request, by entry: a verify's rejected rows
        write entries past the one the next forward reads."""
        return self.verify_width // 2 + 1

    # ---------------------------------------------------------------- records
    @property
    def swa_record(self) -> int:
        return record_bytes(Layout.V41, self.cfg.head_dim)

    @property
    def main_record(self) -> int:
        return record_bytes(self.cfg.main_kv_layout, self.cfg.head_dim)

    @property
    def index_record(self) -> int:
        return record_bytes(Layout.INDEX_K, self.cfg.index_head_dim)

    # ---------------------------------------------------------------- layers
    @property
    def kv_sources(self) -> list:
        return list(self.cfg.kv_source_layer_ids)

    @property
    def ring_layers(self) -> list:
        """Decoder layers whose SWA lives in per-request rings (replay on), else none."""
        if not self.replay:
            return []
        return list(range(self.cfg.decoder_start, self.cfg.num_hidden_layers))

    @property
    def swa_layers(self) -> list:
        """Layers whose SWA lives in the window-bounded SWA pool."""
        ring = set(self.ring_layers)
        return [i for i in range(self.cfg.num_hidden_layers) if i not in ring]

    # ---------------------------------------------------------------- per unit
    def global_bytes_per_token(self) -> float:
        """Main KV + index K per token over all kv sources (890 on V4.1-Flash)."""
        per_entry = self.main_record + self.index_record
        return sum(per_entry / self.cfg.ratio(s) for s in self.kv_sources)

    def swa_bytes_per_slot(self) -> int:
        return self.swa_record * len(self.swa_layers)

    def swa_bytes_per_window(self) -> int:
        """What one request's live window costs in the SWA pool and its rings (all layers)."""
        return self.swa_record * self.cfg.sliding_window * self.cfg.num_hidden_layers

    def pending_bytes_per_request(self) -> int:
        D = self.cfg.head_dim
        pairs = self.pending_slots
        return sum(pairs * 2 * D * 4 for s in self.kv_sources if self.cfg.ratio(s) == 2)

    def ring_bytes_per_request(self) -> int:
        return self.swa_record * self.ring_width * len(self.ring_layers)

    def replay_window_bytes_per_request(self) -> int:
        """A request slot's replay window: one window of V41 records per SWA-pool layer (prefix
        replay on), where the replayed segment's SWA lives (buffers.py)."""
        if not self.prefix_replay:
            return 0
        return self.swa_record * self.cfg.sliding_window * len(self.swa_layers)

    def engram_tail_len(self) -> int:
        return max(self.cfg.engram_max_ngram_size - 1, 0) if self.cfg.engram_layer_ids else 0

    def state_bytes_per_request(self) -> int:
        """Per request slot in this package's buffers: pending pairs, rings, the replay window,
        Engram tail, the two floors and the resume point."""
        tail = 8 * self.engram_tail_len()
        windows = self.ring_bytes_per_request() + self.replay_window_bytes_per_request()
        return self.pending_bytes_per_request() + windows + tail + 3 * 8

    def bytes_per_request_slot(self, context_len: int) -> int:
        """Everything a request slot costs: this package's state plus SGLang's slot table row
        (int32 per position; context_len as SGLang sizes the row)."""
        return self.state_bytes_per_request() + 4 * context_len

    # ---------------------------------------------------------------- allocations
    def entries(self, full_slots: int, layer: int) -> int:
        """Rows of a kv source's main-KV / index-K buffers for `full_slots` buffer slots."""
        return -(-full_slots // self.cfg.ratio(layer))

    def full_buffer_bytes(self, full_slots: int, page_size: int) -> int:
        n = full_slots + page_size
        per_entry = self.main_record + self.index_record
        return sum(self.entries(n, s) * per_entry for s in self.kv_sources)

    def swa_buffer_bytes(self, swa_slots: int, page_size: int) -> int:
        return (swa_slots + page_size) * self.swa_bytes_per_slot()

    def request_buffer_bytes(self, max_requests: int) -> int:
        return (max_requests + 1) * self.state_bytes_per_request()

    def buffer_bytes(self, full_slots: int, swa_slots: int, page_size: int, max_requests: int):
        """Exactly what RecordBuffers allocates for these sizes."""
        return (
            self.full_buffer_bytes(full_slots, page_size)
            + self.swa_buffer_bytes(swa_slots, page_size)
            + self.request_buffer_bytes(max_requests)
        )

    # ---------------------------------------------------------------- sizing
    def full_slots_for(
        self, budget: int, swa_slots: int, page_size: int, max_requests: int, context_len: int
    ) -> int:
        """The most full slots (a multiple of the page) whose buffers, with `swa_slots` SWA slots
        and `max_requests` request slots (SGLang's slot table rows included), fit in `budget`."""
        fixed = self.swa_buffer_bytes(swa_slots, page_size)
        fixed += (max_requests + 1) * self.bytes_per_request_slot(context_len)
        fixed += self.full_buffer_bytes(0, page_size)  # the padding page
        per_token = self.global_bytes_per_token() + MAPPING_BYTES
        tokens = int(max(budget - fixed, 0) // per_token) if per_token else 0
        tokens = tokens // page_size * page_size
        while (
            tokens
            and self.total_bytes(tokens, swa_slots, page_size, max_requests, context_len) > budget
        ):
            tokens -= page_size  # per-entry rounding of the ratio-r buffers
        return tokens

    def sized(
        self,
        budget: int,
        swa_ratio: float | None,
        min_swa: int,
        page_size: int,
        max_requests: int,
        context_len: int,
        max_full: int | None = None,
    ) -> tuple[int, int]:
        """(full slots, SWA slots) of a pool whose buffers fit in `budget`. swa_ratio: the SWA
        room is swa_ratio x the full room (SGLang's --swa-full-tokens-ratio), never below
        min_swa; None: the SWA room is min_swa (what the running requests need). max_full caps
        the full room (--max-total-tokens, the CPU cap)."""
        if swa_ratio is None:
            full = self.full_slots_for(budget, min_swa, page_size, max_requests, context_len)
            if max_full is not None:
                full = min(full, max_full // page_size * page_size)
            return full, min_swa
        per_token = self.global_bytes_per_token() + MAPPING_BYTES
        per_token += swa_ratio * self.swa_bytes_per_slot()
        fixed = self.total_bytes(0, 0, page_size, max_requests, context_len)
        full = int(max(budget - fixed, 0) // per_token) if per_token else 0
        if max_full is not None:
            full = min(full, max_full)
        full = full // page_size * page_size

        def total(n: int) -> int:
            swa = self.swa_room(n, swa_ratio, min_swa, page_size)
            return self.total_bytes(n, swa, page_size, max_requests, context_len)

        while full and total(full) > budget:
            full -= page_size
        while (max_full is None or full + page_size <= max_full) and total(
            full + page_size
        ) <= budget:  # the estimate's rounding
            full += page_size
        return full, self.swa_room(full, swa_ratio, min_swa, page_size)

    @staticmethod
    def swa_room(full: int, swa_ratio: float | None, min_swa: int, page_size: int) -> int:
        """SWA slots for `full` full slots: swa_ratio x full (a multiple of the page), at least
        min_swa; min_swa itself without a ratio."""
        if swa_ratio is None:
            return min_swa
        return max(int(full * swa_ratio) // page_size * page_size, min_swa)

    def total_bytes(self, full, swa, page_size, max_requests, context_len) -> int:
        """Our buffers plus SGLang's slot table rows and full -> SWA mapping: what a pool of
        these sizes costs."""
        table = (max_requests + 1) * 4 * context_len
        mapping = (full + page_size + 1) * MAPPING_BYTES
        return self.buffer_bytes(full, swa, page_size, max_requests) + table + mapping


def swa_slots_needed(
    window: int,
    page_size: int,
    max_requests: int,
    chunk: int,
    eviction_interval: int = 1,
    chunks_in_flight: int = 2,
) -> int:
    """SWA slots the running requests hold at most: per request its window, the tokens that may
    slide out before an eviction runs (SGLang evicts every `eviction_interval` tokens), a page of
    padding to keep eviction page-aligned and a page for the next decode; plus the prefill chunks
    in flight (written before the window slides past them). A multiple of the page."""
    per_request = window + eviction_interval + 2 * page_size
    total = per_request * max_requests + chunks_in_flight * chunk + page_size
    return -(-total // page_size) * page_size
