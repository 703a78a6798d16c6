"""The interfaces the math and the cached path read, as `typing.Protocol`s.

Each has two implementations that serve the same callers:

    Attention    `layers.attention.MqaAttentionBase` (the oracle's and the torch model's modules)
                 and `serving.attention_view.AttentionView` (the same formulas over projections
                 held elsewhere: a tensor-parallel rank's share, SGLang's in-tree layers)
    CompressorPart, IndexerPart   its role parts: `layers.compressor.Compressor` /
                 `layers.indexer.Indexer` and `serving.attention_view.CompressorView` /
                 `IndexerView`
    Residual     `layers.residual.PlainResidual` (hc_mult = 1) and `layers.mhc.MhcResidual`
    LayerStack   what a layer loop reads off a whole model: `reference.ReferenceModel` and
                 the served torch model (`sglang/model.py`)

WeightedOp and NormOp are the projections and norms whose weight is read. Functions that take
one of these say so in their signature (`attn: Attention`). All are
`runtime_checkable`, so a test can hold both implementations to the same member list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from sglang_dsv41.config import DeepseekV41Config

Project = Callable[[Tensor], Tensor]
"""x [..., K] -> x W^T [..., N]: a linear module, a dense view or an in-tree linear."""


@runtime_checkable
class WeightedOp(Protocol):
    """A projection or norm whose weight is read (its dtype picks the store's rounding)."""

    weight: Tensor

    def __call__(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class NormOp(WeightedOp, Protocol):
    """RMSNorm: fp32 statistics over the last dim, `eps` added to the mean square."""

    eps: float


@runtime_checkable
class CompressorPart(Protocol):
    """A Full layer's compressor (layers/compressor.py): entry j pools tokens [j r, j r + r)."""

    ratio: int

    def project(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """x [T, hidden] -> (c fp32 [T, D], z fp32 [T, D] or None at ratio 1)."""
        ...

    def pool(self, c: Tensor, z: Tensor | None) -> Tensor:
        """c, z [n, r, D] -> latent fp32 [n, D] (pre-RoPE, normed)."""
        ...

    def latents(self, x: Tensor) -> Tensor:
        """x [T, hidden] from position 0 -> latents fp32 [T // r, D]."""
        ...


@runtime_checkable
class IndexerPart(Protocol):
    """An index source's indexer (layers/indexer.py); wk / k_norm only on Full layers."""

    n_heads: int
    head_dim: int
    wk: WeightedOp | None
    k_norm: NormOp | None

    def queries(
        self, q_lora: Tensor, x: Tensor, pos: Any, inv_freq: Tensor
    ) -> tuple[Tensor, Tensor]:
        """-> (qI fp32 [T, HI, DI], w fp32 [T, HI]); pos int64 [T] or RopeAngles."""
        ...

    def keys(self, latent: Tensor, entry_pos: Tensor, inv_freq: Tensor) -> Tensor:
        """latent [n, D] (pre-RoPE), entry_pos [n] -> index K fp32 [n, DI]."""
        ...


@runtime_checkable
class Attention(Protocol):
    """One layer's attention as the oracle (`reference.attention`) and the cached path
    (`serving.attention`, `serving.stores`) read it.

    n_heads / head_dim: the heads this object computes (all, or a tensor-parallel rank's share)
    and D; attn_sink fp32 [n_heads]; inv_freq fp32 [R / 2] (the layer's RoPE kind); attn_dtype:
    the sparse attention's I/O dtype (None = the compute dtype, or torch.bfloat16); compressor
    on Full layers, indexer on index sources (Full, Reindex), else None.
    """

    cfg: DeepseekV41Config
    layer_id: int
    role: str
    ratio: int
    n_heads: int
    head_dim: int
    scale: float
    inv_freq: Tensor
    attn_sink: Tensor
    attn_dtype: torch.dtype | None
    wkv: Project
    kv_norm: NormOp
    compressor: CompressorPart | None
    indexer: IndexerPart | None

    @property
    def compute_dtype(self) -> torch.dtype: ...

    def query(self, x: Tensor, pos: Any) -> tuple[Tensor, Tensor]:
        """x [T, hidden], pos int64 [T] or RopeAngles -> (q [T, H, D] with RoPE, q_lora)."""
        ...

    def attention_in(self, q: Tensor) -> Tensor:
        """q [T, H, D] as the sparse attention reads it (attn_dtype)."""
        ...

    def attention_out(self, o: Tensor) -> Tensor:
        """o [T, H, D] as the sparse attention writes it (attn_dtype)."""
        ...

    def swa_kv(self, x: Tensor, pos: Any) -> Tensor:
        """x [T, hidden] -> SWA key/value fp32 [T, D] before quantization."""
        ...

    def main_kv(self, latent: Tensor, entry_pos: Tensor) -> Tensor:
        """latent [n, D] -> main KV fp32 [n, D] with RoPE at the entries' positions."""
        ...

    def output(self, o: Tensor, pos: Any) -> Tensor:
        """o [T, H, D] -> [T, hidden] (a partial sum under tensor parallelism)."""
        ...


@runtime_checkable
class Residual(Protocol):
    """The residual wiring around a block's two sublayers; `state` is the implementation's
    (a tensor [T, hidden], or mHC's (H [T, S, d], pre)) and its first dim is tokens."""

    def init(self, emb: Tensor) -> Any: ...
    def select(self, state: Any, rows: Tensor) -> Any: ...
    def inject(self, state: Any, fn: Callable[[Tensor], Tensor]) -> Any: ...
    def attn_input(self, state: Any, block: Any) -> Tensor: ...
    def attn_done(self, state: Any, block: Any, y: Tensor) -> Any: ...
    def ffn_input(self, state: Any, block: Any) -> Tensor: ...
    def ffn_done(self, state: Any, block: Any, y: Tensor) -> Any: ...
    def final(self, state: Any) -> Tensor: ...


@runtime_checkable
class LayerStack(Protocol):
    """A whole text model as a layer loop reads it: `layers` are `layers.block.Block`s (attn,
    ffn, norms, engram or None); head.weight [vocab, hidden]; engram_hasher None until built."""

    cfg: DeepseekV41Config
    embed: WeightedOp
    layers: Sequence[Any]
    norm: Project
    head: WeightedOp
    residual: Residual
    engram_hasher: Any
