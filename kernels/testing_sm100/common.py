"""What both stand-ins share: the B200's SM count, DeepGEMM's logits padding, the contract check
that names its rule, the record of a call, and the reference helpers that read records the way
the libraries address them."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch

from sglang_dsv41.kv.records import unpack_index_k
from sglang_dsv41.layers.index_math import index_scores

NUM_SMS = 148  # a B200
SPLIT_KV = 256  # DeepGEMM pads logits rows to a multiple of this


def _need(ok, rule: str) -> None:
    if not ok:
        raise AssertionError(f"contract: {rule}")


def _garbage_rows(rows: int, cols: int, dtype) -> torch.Tensor:
    """[rows, cols] logits as DeepGEMM allocates them (row stride padded to SPLIT_KV), NaN where
    the kernel writes nothing (clean_logits=False leaves those unspecified)."""
    full = torch.full((rows, -(-cols // SPLIT_KV) * SPLIT_KV), float("nan"), dtype=dtype)
    return full[:, :cols]


def _queries(q_fp: torch.Tensor, q_sf: torch.Tensor) -> torch.Tensor:
    """Packed FP4 queries int8 [..., H, 64] + int32 [..., H] -> fp32 [..., H, 128]."""
    rec = torch.cat(
        (q_fp.view(torch.uint8), q_sf.contiguous().view(torch.uint8).view(*q_sf.shape, 4)), -1
    )
    return unpack_index_k(rec)


def _paged_record(cache: torch.Tensor, page: int, off: int) -> torch.Tensor:
    """Record (uint8 [68]) at (page, offset) of a fused [pages, P, 1, 68] cache whose pages are
    split (P x 64 value bytes, then P x 4 scale bytes), addressed through its strides."""
    P = cache.shape[1]
    base = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))[page]
    return torch.cat(
        (base[off * 64 : off * 64 + 64], base[P * 64 + off * 4 : P * 64 + off * 4 + 4])
    )


def _scores(
    q_row: torch.Tensor, w_row: torch.Tensor, keys: torch.Tensor, width: int
) -> torch.Tensor:
    """Scores fp32 [width] of one query (q [1, H, 128], w [1, H]) against keys [n <= width,
    128], the keys zero-padded to `width` rows: the reference scores a row against all its
    addressable entries at once, and a matmul's rounding may depend on its shape."""
    pad = torch.zeros(width - keys.shape[0], keys.shape[1], dtype=keys.dtype)
    return index_scores(q_row, w_row.float(), torch.cat((keys, pad)))[0]


def _row_keys(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """Keys fp32 [n, 128] of entries 0..n-1 through a page-table row (page -1: zeros)."""
    P = cache.shape[1]
    recs = []
    for s in range(n):
        page = int(table_row[s // P])
        _need(page < cache.shape[0], f"entry {s}: page {page} inside the cache")
        rec = _paged_record(cache, page, s % P) if page >= 0 else torch.zeros(68, dtype=torch.uint8)
        recs.append(rec)
    return unpack_index_k(torch.stack(recs)) if recs else torch.zeros(0, 128)


@dataclasses.dataclass
class Call:
    name: str
    args: dict


def recording(calls: list, **keys):
    """Decorator of a stand-in library function: each call first appends Call(function name,
    {parameter: value}) to `calls`, every parameter with its default filled in; `keys` renames
    a parameter's record key (`name="key"`) or leaves it out (`name=None`)."""

    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            named = ((keys.get(k, k), v) for k, v in bound.arguments.items())
            calls.append(Call(fn.__name__, {k: v for k, v in named if k is not None}))
            return fn(*args, **kwargs)

        return call

    return wrap
