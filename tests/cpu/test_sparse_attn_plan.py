"""The sparse-attention launcher's shape-only plan (kernels/sparse_attn/triton.py) on the CPU:
which variant each shape gets, the exact path's constraints, and the launcher's refusals. The
kernels themselves run under the interpreter in test_sparse_attn_ref.py and on the GPU in
tests/gpu/test_sparse_attn.py."""

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from sglang_dsv41.kernels.sparse_attn import triton as tri  # noqa: E402

CPU = torch.device("cpu")


def _name(plan: tri.Plan, H: int, exact: bool) -> str:
    named = {n: tri.Plan(**p) for n, p in tri.variants_for(H, exact).items()}
    return next(n for n, p in named.items() if p == plan)


@pytest.mark.parametrize(
    "T, H, exact, want",
    [
        (1, 8, False, "direct_n32_x2"),
        (8, 16, False, "direct_n32_x2"),
        (32, 8, False, "direct_n32_pf_x2"),
        (256, 16, False, "direct_n32_pf_x2"),
        (4096, 8, False, "ws_direct_n64"),
        (40, 32, False, "swap_w8_n32_pf"),
        (4, 64, False, "swap_w8_n32_pf_bh16"),
        (128, 64, False, "skew64_n32"),  # no flash_mla on this device: no FlashMLA route
        (4096, 64, False, "skew64_n32"),
        (1, 8, True, "swap_w8_n32_pf"),
        (8, 8, True, "direct_n32_x2"),
        (1, 64, True, "swap_w8_n32_pf"),
        (2, 64, True, "direct_n32_x2"),
        (256, 64, True, "direct_n32_x2"),
        (2048, 64, True, "ws_direct_n32"),
    ],
)
def test_default_plan_per_shape(T, H, exact, want, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _name(tri.plan_for(T, H, 512, CPU, exact), H, exact) == want


def test_flashmla_routes_when_available(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(tri, "_flashmla_ok", lambda device: True)
    v = tri.variants_for(64)
    assert dataclasses.asdict(tri.plan_for(127, 64, 512, CPU, False)) == v["skew64_n32"]
    assert dataclasses.asdict(tri.plan_for(128, 64, 512, CPU, False)) == v["flashmla_private"]
    assert dataclasses.asdict(tri.plan_for(1024, 128, 512, CPU, False)) == v["flashmla"]
    exact = tri.plan_for(1024, 64, 512, CPU, True)  # fp32 q never takes FlashMLA (bf16 q)
    assert not exact.flashmla and exact.workspace
    # 17-63 heads in prefill: FlashMLA with the heads padded to 64; not at 16, nor in decode
    for H in (17, 32, 48, 63):
        want = tri.variants_for(H)["flashmla"]
        assert dataclasses.asdict(tri.plan_for(1024, H, 512, CPU, False)) == want, H
        assert not tri.plan_for(1023, H, 512, CPU, False).flashmla, H
    assert not tri.plan_for(1024, 16, 512, CPU, False).flashmla
    monkeypatch.setattr(tri, "_flashmla_ok", lambda device: False)
    assert tri.plan_for(1024, 32, 512, CPU, False).workspace


@pytest.mark.parametrize("H", [8, 16, 32, 64, 128])
def test_exact_variants_fit_the_sm(H):
    """fp32 q: 16 heads per program, no FlashMLA, no SKEW; the IEEE variant is offered."""
    v = tri.variants_for(H, exact=True)
    assert all(p["block_h"] == 16 and not p["flashmla"] and not p["skew"] for p in v.values())
    assert v["ieee_bh16"]["ieee"] and sum(p["ieee"] for p in v.values()) == 1


def test_small_head_dims_keep_ieee_products(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert tri.plan_for(40, 4, 64, CPU, True).ieee  # the tiny preset's D = 64
    assert not tri.plan_for(40, 4, 64, CPU, False).ieee
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter exercises the three parts
    assert not tri.plan_for(40, 4, 64, CPU, True).ieee


def test_launcher_refusals(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.zeros(2, 8, 512)  # fp32 at D = 512: the three-part exact path
    rec = torch.zeros(4, 288, dtype=torch.uint8)
    sw = torch.zeros(2, 0, dtype=torch.int32)
    tk = torch.zeros(2, 4, dtype=torch.int32)
    args = (q, rec, sw, rec, tk, True, None, 0.125, None)
    with pytest.raises(ValueError, match="neither the FlashMLA route nor SKEW"):
        tri.sparse_attention(*args, skew=True)
    with pytest.raises(ValueError, match="neither the FlashMLA route nor SKEW"):
        tri.sparse_attention(*args, flashmla=True)
    with pytest.raises(ValueError, match="block_n >= 32"):  # wrong output on the H200
        tri.sparse_attention(*args, block_n=16)
    with pytest.raises(TypeError, match="unknown launch options"):
        tri.sparse_attention(*args, block_m=16)
