"""The in-tree replay-tail protocol, implemented from this package's replay floors.

With decoder SWA bounded replay on, SGLang's in-tree V4 layer loop (DeepseekV4Model) runs the
layers from `late_layer_start` (the last kv source, the first decoder layer) over a tail of
rows only, and asks the attention backend for five members:

    tail_forward_metadata.late_layer_tail   the tail rows (SGLang's LateLayerTail struct)
    write_tail_source_kv(layer, x, ...)     the source layer's input over every row, before the
                                            tail; here it is kept and handed to that layer's own
                                            forward as `x_all` (our path compresses all rows
                                            there, then attends the tail rows)
    enter_late_layer_tail(fb) -> saved      the layers now see the tail rows
    exit_late_layer_tail(saved, fb)         back to every row
    prefill_graph_late_layer_saved          prefill CUDA graphs only; they stay off (None)

The tail (docs/design.md 2.5): per request, the rows at positions >= its floor (the replay floor in
its request slot of the pool, 0 for a full forward), i.e. the last min(window, prompt) prompt
tokens. It is built for every extend batch while the pool's ServingOptions have replay on (the in-
tree loop then reads it on every extend, even one with nothing below a floor). The mixin is
cooperative: `class B(LateLayerTailMixin, DSV41AttnBackend)` builds the tail after the base class
built `forward_batch.dsv41_context` (`DSV41TailBackend` below)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_dsv41.serving.context import BatchContext, Rows
from sglang_dsv41.sglang.backend import DSV41AttnBackend


@dataclass
class TailMetadata:
    """What the in-tree loop reads (`late_layer_tail`) and the tail's rows for our layers."""

    late_layer_tail: object  # sglang's LateLayerTail
    rows: Rows


@dataclass
class LateTail:
    """Between enter and exit: the rows the late layers run over, and the kv source's input
    over every row until that layer takes it."""

    rows: Rows
    source_layer: int | None = None
    source: tuple | None = field(default=None, repr=False)  # (x [T_all, hidden], Rows)

    def take_source(self) -> tuple:
        x_all, rows_all = self.source
        self.source = None
        return x_all, rows_all


def rows_per_request(rows: Rows, batch_size: int) -> torch.Tensor:
    """int64 [B]: how many of `rows` each request of the batch has (0 where none)."""
    return torch.bincount(rows.req, minlength=batch_size)


def tail_rows(ctx: BatchContext) -> tuple[torch.Tensor, Rows, torch.Tensor]:
    """(keep bool [T], the kept Rows, kept rows per request int64 [B]) of a batch under its
    floors."""
    keep = ctx.rows.pos >= ctx.row_floors(ctx.rows)
    rows = ctx.rows.select(keep)
    return keep, rows, rows_per_request(rows, ctx.batch_size)


def late_layer_tail(forward_batch, ctx: BatchContext):
    """SGLang's LateLayerTail for this batch's tail rows (device tensors on the batch's device).
    Extend only: one host sync for the per-request tail lengths SGLang wants on the host."""
    from sglang.srt.layers.attention.deepseek_v4_backend import LateLayerTail

    _, rows, kept = tail_rows(ctx)
    dev = forward_batch.out_cache_loc.device
    idx = rows.ids.to(dev)
    lens = kept.tolist()
    contiguous = None
    if ctx.batch_size == 1:
        contiguous = ctx.rows.n - lens[0]
    return LateLayerTail(
        token_indices=idx,
        positions=forward_batch.positions[idx],
        extend_seq_lens=kept.to(dev, torch.int32),
        extend_seq_lens_cpu=lens,
        swa_out_cache_loc=forward_batch.out_cache_loc[idx],
        contiguous_start=contiguous,
    ), rows


class LateLayerTailMixin:
    """Backend members of the in-tree replay-tail protocol (module docstring). The backend
    carries `token_to_kv_pool` (a RecordBuffers: its `replay` is the served model's switch)."""

    wants_late_layer_tail = True  # False: the served model replays in its own loop
    tail_forward_metadata: TailMetadata | None = None
    late_tail: LateTail | None = None
    prefill_graph_late_layer_saved = None
    _tail_source: tuple | None = None

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self.init_late_layer_tail(forward_batch)

    def init_late_layer_tail(self, forward_batch) -> None:
        self.tail_forward_metadata, self.late_tail, self._tail_source = None, None, None
        ctx = getattr(forward_batch, "dsv41_context", None)
        if ctx is None or not self.wants_late_layer_tail or not self.token_to_kv_pool.replay:
            return
        if not forward_batch.forward_mode.is_extend_without_speculative():
            return
        tail, rows = late_layer_tail(forward_batch, ctx)
        self.tail_forward_metadata = TailMetadata(tail, rows)

    def write_tail_source_kv(self, *, layer, x, positions, forward_batch) -> None:
        ctx = forward_batch.dsv41_context
        if x.shape[0] != ctx.rows.n:
            raise RuntimeError(
                f"write_tail_source_kv: {x.shape[0]} rows, the batch has {ctx.rows.n}"
            )
        self._tail_source = (layer.layer_id, x, ctx.rows)

    def enter_late_layer_tail(self, forward_batch) -> tuple:
        meta = self.tail_forward_metadata
        if meta is None:
            raise RuntimeError("enter_late_layer_tail: no tail metadata for this forward")
        saved = (self.late_tail,)
        tail = LateTail(rows=meta.rows)
        if self._tail_source is not None:
            tail.source_layer, x, rows_all = self._tail_source
            tail.source = (x, rows_all)
            self._tail_source = None
        self.late_tail = tail
        return saved

    def exit_late_layer_tail(self, saved: tuple, forward_batch) -> None:
        (self.late_tail,) = saved


class DSV41TailBackend(LateLayerTailMixin, DSV41AttnBackend):
    """The `dsv41` backend the plugin registers: the base builds the batch context, the mixin
    the replay tail, but only when the served model runs SGLang's in-tree layer loop
    (`cuda_model.DeepseekV41ForCausalLM.uses_late_layer_tail`); the pure-torch model replays in
    its own loop and pays nothing."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        model = getattr(model_runner, "model", None)
        self.wants_late_layer_tail = bool(getattr(model, "uses_late_layer_tail", False))


def create_backend(model_runner):
    return DSV41TailBackend(model_runner)
