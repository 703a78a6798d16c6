"""The interfaces of layers/protocols.py: both implementations of each satisfy it, and the oracle
and the cached path read nothing of an attention layer beyond the `Attention` protocol."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.layers.mhc import MhcResidual
from sglang_dsv41.layers.protocols import (
    Attention,
    CompressorPart,
    IndexerPart,
    LayerStack,
    Residual,
)
from sglang_dsv41.layers.residual import PlainResidual
from sglang_dsv41.serving.attention_view import full_view, local_heads
from sglang_dsv41.serving.toy import ToyEngine, prompts, serve, toy_model


def members(proto) -> set:
    """The names a protocol declares: annotated attributes, methods and properties."""
    names = set()
    for klass in proto.__mro__:
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        names |= set(getattr(klass, "__annotations__", {}))
        names |= {n for n, v in vars(klass).items() if callable(v) or isinstance(v, property)}
    return {n for n in names if not n.startswith("_")}


@pytest.fixture(scope="module")
def model():
    return toy_model()


def test_both_attention_implementations_satisfy_the_protocol(model):
    cfg = model.cfg
    roles = set()
    for block in model.layers:
        attn = block.attn
        roles.add(attn.role)
        for impl in (attn, full_view(attn), local_heads(attn, 2, 1)):
            assert isinstance(impl, Attention), (type(impl).__name__, attn.layer_id)
            assert impl.compressor is None or isinstance(impl.compressor, CompressorPart)
            assert impl.indexer is None or isinstance(impl.indexer, IndexerPart)
            assert (impl.compressor is None) == (attn.role != "full")
    assert roles == {"swa", "full", "reindex", "reuse"}
    assert isinstance(model, LayerStack) and cfg.num_hidden_layers == len(model.layers)


def test_a_missing_member_is_not_an_attention(model):
    view = full_view(model.layers[1].attn)
    names = members(Attention)
    assert {"query", "output", "attention_in", "inv_freq", "cfg"} <= names
    for name in ("query", "attn_dtype", "compute_dtype"):
        partial = SimpleNamespace(**{n: getattr(view, n) for n in names - {name}})
        assert not isinstance(partial, Attention), name
    whole = SimpleNamespace(**{n: getattr(view, n) for n in names})
    assert isinstance(whole, Attention)


def test_both_residuals_satisfy_the_protocol():
    cfg = preset("tiny")
    cfg.hc_mult = 4
    assert isinstance(PlainResidual(), Residual) and isinstance(MhcResidual(cfg), Residual)


class Recorder:
    """Forwards every attribute to `inner` and records its name in `seen[kind]`."""

    def __init__(self, inner, kind: str, seen: dict):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name):
        self._seen.setdefault(self._kind, set()).add(name)
        value = getattr(self._inner, name)
        if name in ("compressor", "indexer") and value is not None:
            return Recorder(value, name, self._seen)
        return value


def _record_attention(model) -> dict:
    """Replace every layer's attention module by a Recorder of it; returns what they record."""
    seen = {}
    for block in model.layers:
        attn = block.attn
        del block._modules["attn"]  # a plain attribute from now on
        block.attn = Recorder(attn, "attn", seen)
    return seen


@torch.no_grad()
def test_oracle_and_cached_path_read_only_the_protocol():
    model = toy_model()
    ps = prompts([20, 41])
    want = [model.generate(p, 2, replay=True) for p in ps]
    seen = _record_attention(model)
    floors = [model.cfg.replay_floor(len(p)) for p in ps]
    got = serve(ToyEngine(model, replay=True), ps, 2, chunk=9, floors=floors)
    assert got == want
    assert seen["attn"] <= members(Attention), seen["attn"] - members(Attention)
    assert seen["compressor"] <= members(CompressorPart)
    assert seen["indexer"] <= members(IndexerPart)
    cached = dict(seen)
    seen.clear()
    assert [model.generate(p, 2, replay=True) for p in ps] == want  # the oracle
    assert seen["attn"] <= members(Attention), seen["attn"] - members(Attention)
    assert seen["compressor"] <= members(CompressorPart)
    assert seen["indexer"] <= members(IndexerPart)
    assert {"query", "output", "attn_sink"} <= cached["attn"] & seen["attn"]
