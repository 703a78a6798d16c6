"""Sparse attention reference vs brute force, slot-list helpers, CPU dispatch, interpreted
Triton."""

import math

import pytest
import torch

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.sparse_attn import (
    entry_slots,
    sparse_attention,
    sparse_attention_ref,
    swa_window_slots,
)
from sglang_dsv41.kernels.sparse_attn.ref import decode_records, gather_records
from sglang_dsv41.kernels.sparse_attn.variants import Tiles
from sglang_dsv41.kv.records import Layout, pack, unpack
from sglang_dsv41.layers.sparse_attention import sparse_attention as attention_formula


def _brute(q, swa, sw, kv, tk, layout, sink, scale):
    """Per token and head: explicit entry list, one softmax in float64, sink unscaled with value
    0."""
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        keys = [unpack(Layout.V41, swa[s]) for s in sw[t].tolist() if s >= 0]
        keys += [unpack(layout, kv[s]) for s in tk[t].tolist() if s >= 0]
        for h in range(H):
            logits = [float(q[t, h].double() @ k.double()) * scale for k in keys]
            extra = [float(sink[h])] if sink is not None else []
            if not logits and not extra:
                continue
            m = max(logits + extra)
            w = [math.exp(v - m) for v in logits]
            den = sum(w) + sum(math.exp(v - m) for v in extra)
            for wi, k in zip(w, keys, strict=False):
                out[t, h] += wi / den * k.double()
    return out


def _case(T=4, H=3, D=64, W=5, TOPK=7, S=24, layout=Layout.V41_FP4):
    swa = pack(Layout.V41, torch.randn(S, D) * 2)
    kv = pack(layout, torch.randn(S, D) * 2)
    q = torch.randn(T, H, D)
    sw = torch.randint(0, S, (T, W), dtype=torch.int32)
    tk = torch.randint(0, S, (T, TOPK), dtype=torch.int32)
    sw[0, :2] = -1  # short sequence
    tk[1, 3:] = -1  # top-k larger than the visible entries
    sw[2] = -1
    tk[2] = -1  # sees nothing
    return q, swa, sw, kv, tk


@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("with_sink", [True, False])
def test_reference_vs_brute_force(layout, with_sink):
    q, swa, sw, kv, tk = _case(layout=layout)
    sink = torch.randn(q.shape[1]) if with_sink else None
    scale = q.shape[-1] ** -0.5
    ref = sparse_attention_ref(
        q, SparseKV(swa, sw, kv, tk, layout), sink, scale, torch.float64, chunk=3
    )
    torch.testing.assert_close(
        ref, _brute(q, swa, sw, kv, tk, layout, sink, scale), rtol=1e-5, atol=1e-6
    )
    assert (ref[2] == 0).all()


def test_sink_lowers_the_mass():
    q, swa, sw, kv, tk = _case()
    o0 = sparse_attention_ref(
        q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4), None, None, torch.float32
    )
    big = sparse_attention_ref(
        q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4), torch.full((3,), 60.0), None, torch.float32
    )
    assert o0[0].abs().sum() > 0 and big.abs().max() < 1e-12


def test_swa_only_and_dispatch_on_cpu():
    q, swa, sw, kv, tk = _case()
    a = sparse_attention(
        q, SparseKV(swa, sw, None, None, Layout.V41_FP4), None, out_dtype=torch.float32
    )
    b = sparse_attention_ref(
        q, SparseKV(swa, sw, None, None, Layout.V41_FP4), out_dtype=torch.float32
    )
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 4])
def test_records_decoded_once_match_a_gather_per_row(rows):
    """The CPU reference decodes each distinct record once (the top-k list possibly decoded by
    the caller: SparseKV.topk_decoded); its bytes equal the per-row gather of the records."""
    q, swa, sw, kv, tk = _case()
    q, sw, tk = q[:rows], sw[:rows], tk[:rows]
    sink, D = torch.randn(q.shape[1]), q.shape[-1]
    k_swa, k_top = gather_records(swa, sw, Layout.V41, D), gather_records(kv, tk, Layout.V41_FP4, D)
    o = attention_formula(q, k_swa, sw >= 0, k_top, tk >= 0, sink, D**-0.5)
    seen = torch.cat((sw >= 0, tk >= 0), 1).any(1)[:, None, None]
    expect = torch.where(seen, o, torch.zeros(()))
    shared = decode_records(kv, tk, Layout.V41_FP4, D)
    for decoded in (None, shared):
        got = sparse_attention_ref(
            q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4, decoded), sink, out_dtype=torch.float32
        )
        assert torch.equal(got, expect)
    with pytest.raises(ValueError, match="topk_decoded"):
        SparseKV(swa, sw, kv, tk[:, :3], Layout.V41_FP4, shared)


def test_swa_window_slots_vs_brute_force():
    B, L, W = 3, 20, 6
    req_to_slot = torch.randperm(B * L).view(B, L).to(torch.int32)
    req_to_slot[1, 4] = -1
    req_index = torch.tensor([0, 1, 1, 2, 2])
    pos = torch.tensor([2, 9, 4, 19, 12])
    floor = torch.tensor([0, 7, 0, 15, 0])
    got = swa_window_slots(req_to_slot, req_index, pos, W, floor)
    for t in range(5):
        for w in range(W):
            p = pos[t].item() - W + 1 + w
            want = req_to_slot[req_index[t], p].item() if p >= floor[t].item() else -1
            assert got[t, w].item() == want, (t, w)
    assert got.dtype == torch.int32


def test_entry_slots():
    req_to_entry = torch.arange(40, dtype=torch.int32).view(2, 20) + 100
    topk = torch.tensor([[3, -1, 0], [19, 5, -1]])
    got = entry_slots(req_to_entry, torch.tensor([1, 0]), topk)
    assert got.tolist() == [[123, -1, 120], [19 + 100, 105, -1]]


# The Triton kernel's switches (kernels/sparse_attn/variants.py, Tiles), over the records (the
# plan's variant under the interpreter) and over the bf16 workspace, each run under the
# interpreter: (variant or None, Tiles fields beside block_h and num_warps, num_splits).
INTERP_VARIANTS = [
    (None, dict(swap=True, prefetch=True, block_n=16), None),
    (None, dict(swap=True, skew=True, prefetch=True, block_n=16), 3),
    (None, dict(swap=True, block_n=32), 2),
    (None, dict(swap=False, block_n=16), None),
    (None, dict(swap=False, skew=True, block_n=16), 3),
    (None, dict(swap=False, prefetch=True, block_n=32), 2),
    ("ws_direct_n32", dict(swap=False, block_n=16), None),
    ("ws_direct_n32", dict(swap=True, block_n=32), 2),
]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("H", [8, 16, 32])
def test_triton_kernel_variants_interpreted(H):
    """Every kernel variant, both main-KV layouts, split and unsplit, at a rank's head count,
    against the fp32 reference (the interpreter computes the tiles in fp32)."""
    from sglang_dsv41.kernels.sparse_attn import triton as tri

    D, T, W, TOPK, S = 64, 3, 10, 20, 40
    for layout in (Layout.V41_FP4, Layout.V41):
        for variant, switches, ns in INTERP_VARIANTS:
            swa = pack(Layout.V41, torch.randn(S, D))
            kv = pack(layout, torch.randn(S, D))
            q = torch.randn(T, H, D).to(torch.bfloat16)
            sw = torch.randint(0, S, (T, W), dtype=torch.int32)
            sw[0, :4] = -1
            sw[2] = -1
            tk = torch.randint(0, S, (T, TOPK), dtype=torch.int32)
            tk[1, 5:] = -1
            tk[2] = -1
            sink = torch.randn(2 * H)[H:] if ns else None
            ref = sparse_attention_ref(
                q, SparseKV(swa, sw, kv, tk, layout), sink, None, torch.float32
            )
            out = torch.full((T, H, D), float("nan"))
            tri.sparse_attention(
                q, swa, sw, kv, tk, layout is Layout.V41_FP4, sink, D**-0.5, out,
                variant=variant, num_splits=ns,
                tiles=Tiles(block_h=max(16, H), num_warps=4, **switches),
            )  # fmt: skip
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 1e-5 and (out[2] == 0).all(), (layout, variant, switches, err)


def _interp_err(q, swa, sw, kv, tk, layout, sink, ref, launch) -> float:
    from sglang_dsv41.kernels.sparse_attn import triton as tri

    out = torch.full(q.shape, float("nan"))
    D = q.shape[-1]
    variant, switches, ns = launch
    tri.sparse_attention(
        q, swa, sw, kv, tk, layout is Layout.V41_FP4, sink, D**-0.5, out,
        variant=variant, num_splits=ns, tiles=Tiles(block_h=16, num_warps=4, **switches),
    )  # fmt: skip
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.triton_interpret
def test_exact_path_three_parts_interpreted():
    """fp32 q takes the exact path: q and P as three bf16 parts each (the interpreter computes
    the parts' products in fp32). Against the fp32 reference it is exact up to summation order,
    while the same q rounded to bf16 (what a kernel using only the first part computes) is
    ~1e-3 away."""
    D, T, H, W, TOPK, S = 64, 3, 8, 10, 20, 40
    for layout in (Layout.V41_FP4, Layout.V41):
        for launch in INTERP_VARIANTS:
            if launch[1].get("skew"):
                continue
            swa = pack(Layout.V41, torch.randn(S, D))
            kv = pack(layout, torch.randn(S, D))
            q = torch.randn(T, H, D) * 3
            sw = torch.randint(0, S, (T, W), dtype=torch.int32)
            sw[0, :4] = -1
            tk = torch.randint(0, S, (T, TOPK), dtype=torch.int32)
            tk[1, 5:] = -1
            sink = torch.randn(H)
            ref = sparse_attention_ref(
                q, SparseKV(swa, sw, kv, tk, layout), sink, None, torch.float32
            )
            case = (swa, sw, kv, tk, layout, sink, ref, launch)
            err = _interp_err(q, *case)
            err_first_part = _interp_err(q.to(torch.bfloat16).float(), *case)
            assert err < 1e-6, (layout, launch, err)
            assert err_first_part > 1e-4, (layout, launch, err_first_part)


def _workspace_case(layout, D, T, W, TOPK, S1, S2):
    """(swa, sw, kv, tk): S1 SWA and S2 main records, T tokens' slot lists with a short window
    (token 0), top-k padding (token 1) and a token that sees nothing (token 3)."""
    swa = pack(Layout.V41, torch.randn(S1, D))
    kv = pack(layout, torch.randn(S2, D))
    sw = torch.randint(0, S1, (T, W), dtype=torch.int32)
    tk = torch.randint(0, S2, (T, TOPK), dtype=torch.int32)
    sw[0, :2] = -1
    tk[1, 4:] = -1
    sw[3] = -1
    tk[3] = -1
    return swa, sw, kv, tk


@pytest.mark.triton_interpret
@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
def test_private_workspace_interpreted(layout):
    """The decode workspace: entry j of token t dequantized at row t N + j, -1 kept, lists padded
    to 64 with -1; a token that sees nothing reads the zero last row."""
    from sglang_dsv41.kernels.sparse_attn.triton_workspace import build_private_workspace

    D, T, W, TOPK, S1, S2 = 64, 4, 6, 9, 30, 50
    N = W + TOPK
    swa, sw, kv, tk = _workspace_case(layout, D, T, W, TOPK, S1, S2)
    ws, rows = build_private_workspace(swa, sw, kv, tk, layout is Layout.V41_FP4, D)
    assert ws.shape == (T * N + 1, D) and rows.shape == (T, 64)
    keys = torch.cat((gather_records(swa, sw, Layout.V41, D), gather_records(kv, tk, layout, D)), 1)
    valid = torch.cat((sw, tk), 1) >= 0
    want = torch.where(valid, torch.arange(T * N, dtype=torch.int32).view(T, N), -1)
    want[3, 0] = T * N  # the zero row
    assert torch.equal(rows[:, :N], want) and (rows[:, N:] == -1).all()
    assert torch.equal(ws.float()[rows[:, :N].clamp(min=0).long()][valid], keys[valid])
    assert (ws[T * N] == 0).all()


@pytest.mark.triton_interpret
def test_workspaces_sized_to_the_referenced_slots_interpreted(monkeypatch):
    """Outside graph capture, when the static bound needs chunks, the workspace is built once for
    every token with one row per referenced slot (plus the zero row); MAX_ROWS below that falls
    back to chunks of the static bound."""
    from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

    D, T, W, TOPK, S1, S2 = 64, 5, 6, 9, 30, 50
    swa, sw, kv, tk = _workspace_case(Layout.V41_FP4, D, T, W, TOPK, S1, S2)
    n_ref = len(set(sw[sw >= 0].tolist())) + len(set(tk[tk >= 0].tolist()))
    monkeypatch.setattr(tw, "MAX_ROWS", n_ref + 1)
    assert n_ref + 1 < min(S1 + S2, T * (W + TOPK)) and len(tw.token_chunks(swa, sw, kv, tk)) > 1
    (t0, t1, ws, rows), *more = list(tw.workspaces(swa, sw, kv, tk, True, D))
    assert (t0, t1) == (0, T) and not more and ws.shape == (n_ref + 1, D)
    keys = torch.cat(
        (gather_records(swa, sw, Layout.V41, D), gather_records(kv, tk, Layout.V41_FP4, D)), 1
    )
    valid = torch.cat((sw, tk), 1) >= 0
    got = ws.float()[rows[:, : W + TOPK].clamp(min=0).long()]
    assert torch.equal(got[valid], keys[valid]) and rows[3, 0] == n_ref
    monkeypatch.setattr(tw, "MAX_ROWS", 32)  # under n_ref + 1: chunks of 32 // 15 = 2 tokens
    assert [c[:2] for c in tw.workspaces(swa, sw, kv, tk, True, D)] == [(0, 2), (2, 4), (4, 5)]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("layout", [Layout.V41_FP4, Layout.V41])
@pytest.mark.parametrize("exact_size", [False, True])
@pytest.mark.parametrize("big", [False, True])
def test_flashmla_workspace_interpreted(layout, exact_size, big):
    """The FlashMLA path's workspace: each referenced record once, dequantized; entry lists
    remapped to its rows (-1 kept, padded to 64); a token with no entry reads the zero row; rows
    0 .. U - 1 for the U referenced slots (each once), R = min(slots, T N) + 1 or, exact_size,
    U + 1. big: caches of more slots than the T N entries (a served pool's case)."""
    from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

    D, T, W, TOPK = 64, 5, 6, 9
    S1, S2 = (300, 500) if big else (30, 50)
    swa, sw, kv, tk = _workspace_case(layout, D, T, W, TOPK, S1, S2)
    ws, rows = tw.build_workspace(swa, sw, kv, tk, layout is Layout.V41_FP4, D, exact_size)
    n_ref = len(set(sw[sw >= 0].tolist())) + len(set(tk[tk >= 0].tolist()))
    R = n_ref + 1 if exact_size else min(S1 + S2, T * (W + TOPK)) + 1
    assert ws.shape == (R, D) and rows.shape == (T, 64)
    assert (rows[:, W + TOPK :] == -1).all()
    keys = torch.cat((gather_records(swa, sw, Layout.V41, D), gather_records(kv, tk, layout, D)), 1)
    valid = torch.cat((sw, tk), 1) >= 0
    read = valid.clone()
    read[3, 0] = True  # the token that sees nothing reads the zero row
    assert torch.equal(rows[:, : W + TOPK] >= 0, read)
    got = ws.float()[rows[:, : W + TOPK].clamp(min=0).long()]
    assert torch.equal(got[valid], keys[valid])
    # compacted: each referenced slot at one row, rows 0 .. n_ref - 1 all used
    slot = torch.cat((sw, torch.where(tk >= 0, tk + S1, -1)), 1)[valid]
    row = rows[:, : W + TOPK][valid]
    pairs = set(zip(slot.tolist(), row.tolist(), strict=True))
    assert len(pairs) == n_ref and {r for _, r in pairs} == set(range(n_ref))
    assert rows[3, 0] == R - 1 and (ws[R - 1] == 0).all()


@pytest.mark.triton_interpret
@pytest.mark.parametrize("stale", ["entries", "previous_call", "garbage"])
def test_workspace_claims_ignore_stale_marks_interpreted(stale, monkeypatch):
    """The claim array is never cleared: whatever it holds (indices of entries with other
    slots, a previous call's claims over other lists, values out of range), every entry reads
    its own record and each referenced slot gets one row."""
    from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

    D, T, W, TOPK, S1, S2 = 64, 5, 6, 9, 30, 50
    N = W + TOPK
    swa, sw, kv, tk = _workspace_case(Layout.V41_FP4, D, T, W, TOPK, S1, S2)
    g = torch.Generator().manual_seed(3)
    if stale == "entries":
        mark = torch.randint(0, T * N, (S1 + S2,), generator=g, dtype=torch.int32)
    elif stale == "garbage":
        mark = torch.randint(-(2**31), 2**31 - 1, (S1 + S2,), generator=g, dtype=torch.int32)
    else:  # the claims of another call, over the same caches
        mark = torch.empty(S1 + S2, dtype=torch.int32)
        monkeypatch.setattr(tw, "_claim_array", lambda n, dev: mark)
        tw.build_workspace(swa, sw.flip(0), kv, tk.roll(3, dims=1), True, D)
    monkeypatch.setattr(tw, "_claim_array", lambda n, dev: mark)
    ws, rows = tw.build_workspace(swa, sw, kv, tk, True, D, True)
    n_ref = len(set(sw[sw >= 0].tolist())) + len(set(tk[tk >= 0].tolist()))
    assert ws.shape == (n_ref + 1, D)
    keys = torch.cat(
        (gather_records(swa, sw, Layout.V41, D), gather_records(kv, tk, Layout.V41_FP4, D)), 1
    )
    valid = torch.cat((sw, tk), 1) >= 0
    got = ws.float()[rows[:, :N].clamp(min=0).long()]
    assert torch.equal(got[valid], keys[valid])
    assert set(rows[:, :N][valid].tolist()) == set(range(n_ref))


@pytest.mark.triton_interpret
def test_workspace_skips_slots_outside_the_caches_interpreted():
    """A slot beyond its cache is left out (read as -1) instead of written past the claim
    array."""
    from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

    D, T, W, TOPK, S1, S2 = 64, 5, 6, 9, 30, 50
    swa, sw, kv, tk = _workspace_case(Layout.V41_FP4, D, T, W, TOPK, S1, S2)
    sw[2, 1], tk[2, 2] = S1 + 5, S2
    ws, rows = tw.build_workspace(swa, sw, kv, tk, True, D, True)
    assert rows[2, 1] == -1 and rows[2, W + 2] == -1
    ok = (sw[2] >= 0) & (sw[2] < S1)
    assert (rows[2, :W][ok] >= 0).all()


def test_split_grids_have_no_empty_splits():
    """`pick_splits`: each split gets a ceil share of the tiles, and there are no more splits
    than give each program that many (the 64-head kernel at 16 tokens had 8 splits of 10 tiles,
    three of them empty, and took 22.7 us against 19.8 with 5 on the H200)."""
    from sglang_dsv41.kernels.sparse_attn.merge import pick_splits

    cpu = torch.device("cpu")  # 2 "SMs" off CUDA
    for n_tiles in range(0, 50):
        for per_sm in range(1, 200):
            ns = pick_splits(1, 1, n_tiles, cpu, per_sm)
            fill = max(1, min(n_tiles, 2 * per_sm))  # the splits that fill the grid
            assert 1 <= ns <= fill, (n_tiles, per_sm, ns)
            if n_tiles:  # the same tiles a program as the filling grid, and the last split has some
                per = -(-n_tiles // ns)
                assert per == -(-n_tiles // fill) and (ns - 1) * per < n_tiles, (n_tiles, per_sm)
    assert pick_splits(1, 1, 10, cpu, 4) == 5  # 8 fit the grid; 5 give the same 2 tiles each


def test_merge_launch_shape_bounds_each_threads_values():
    """The merge's programs at every split count: DC columns dividing D, and at most 128 partial
    values a thread held at once (512 columns on two warps at 64 splits, 512 values a thread,
    took 51 us instead of 12 on the H200)."""
    from sglang_dsv41.kernels.sparse_attn import merge

    for ns in range(1, 129):
        ns_p2, dc, warps = merge.launch_shape(ns, 512)
        assert ns_p2 >= ns and 512 % dc == 0 and warps in (1, 2)
        assert ns_p2 * dc // (32 * warps) <= 128, (ns, dc, warps)
    assert merge.launch_shape(3, 64) == (4, 64, 1)  # never wider than D


@pytest.mark.triton_interpret
def test_combine_in_column_chunks_interpreted():
    """The merge of split partials (`merge.combine`) against its formula, with enough splits
    that each program takes a chunk of the columns (20 splits x 512: four chunks of 128), a
    split that saw nothing (lse -inf), a token whose splits all saw nothing, with and without
    the sink, fp32 and bf16 partials (the wg64 kernel's, for a bf16 output)."""
    from sglang_dsv41.kernels.sparse_attn import merge

    T, NS, H, D = 3, 20, 5, 512
    assert merge.launch_shape(NS, D) == (32, 128, 1)
    lse = torch.randn(T, NS, H) * 3
    lse[0, 7] = float("-inf")
    lse[2] = float("-inf")
    cases = ((torch.randn(H), torch.float32), (None, torch.float32), (None, torch.bfloat16))
    for sink, pdt in cases:
        part = torch.randn(T, NS, H, D).to(pdt)
        out = torch.full((T, H, D), float("nan"))
        merge.combine(part, lse, sink if sink is not None else lse, out, sink is not None)
        s2 = sink * 1.4426950408889634 if sink is not None else torch.full((H,), float("-inf"))
        m = torch.maximum(lse.amax(1), s2).clamp_min(-1e30)  # [T, H]
        w = torch.exp2(lse - m[:, None])
        den = w.sum(1) + torch.exp2(s2 - m)
        want = (part.float() * w[..., None]).sum(1) / torch.where(den > 0, den, 1.0)[..., None]
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
        assert (out[2] == 0).all()


def test_sparse_kv_max_slots_is_a_host_int():
    """SparseKV.max_slots: a non-negative host int or None; anything else names the field."""
    q, swa, sw, kv, tk = _case()
    assert SparseKV(swa, sw, kv, tk, Layout.V41_FP4, max_slots=0).max_slots == 0
    for bad in (-1, 2.5, torch.tensor(3)):
        with pytest.raises(ValueError, match="max_slots"):
            SparseKV(swa, sw, kv, tk, Layout.V41_FP4, max_slots=bad)


@pytest.mark.triton_interpret
def test_workspace_bound_by_max_slots_interpreted(monkeypatch):
    """A caller's bound on the referenced slots (SparseKV.max_slots; the served layer's
    serving.context.slots_bound) sizes the workspace without the host sync: at or above the
    truth, one chunk of max_slots + 1 rows plus a NaN row, and the attention over it equals the
    reference; below it, exactly the tokens with an entry past the bound come out NaN (they read
    the NaN row), the others still equal the reference, and nothing is written out of bounds."""
    from sglang_dsv41.kernels.sparse_attn import triton as tri
    from sglang_dsv41.kernels.sparse_attn import triton_workspace as tw

    D, T, W, TOPK, S1, S2, H = 64, 5, 6, 9, 300, 500, 16
    swa, sw, kv, tk = _workspace_case(Layout.V41_FP4, D, T, W, TOPK, S1, S2)
    n_ref = len(set(sw[sw >= 0].tolist())) + len(set(tk[tk >= 0].tolist()))
    monkeypatch.setattr(tw, "MAX_ROWS", n_ref + 8)  # the static bound T N needs chunks
    assert len(tw.token_chunks(swa, sw, kv, tk)) > 1
    synced = []
    exact = tw.build_workspace
    monkeypatch.setattr(
        tw, "build_workspace", lambda *a, **k: synced.append(a[6:]) or exact(*a, **k)
    )
    q = torch.randn(T, H, D).to(torch.bfloat16)
    sink = torch.randn(H)
    ref = sparse_attention_ref(
        q, SparseKV(swa, sw, kv, tk, Layout.V41_FP4), sink, None, torch.float32
    )
    for bound in (n_ref, n_ref + 3):
        (t0, t1, ws, rows), *more = list(tw.workspaces(swa, sw, kv, tk, True, D, max_slots=bound))
        assert (t0, t1) == (0, T) and not more and ws.shape == (bound + 2, D)
        assert ws[bound + 1].isnan().all() and not (rows == bound + 1).any()
        out = torch.full((T, H, D), float("nan"))
        tri.sparse_attention(
            q, swa, sw, kv, tk, True, sink, D**-0.5, out, max_slots=bound,
            variant="ws_direct_n32", tiles=Tiles(block_h=16, block_n=16, num_warps=4),
        )  # fmt: skip
        assert ((out - ref).norm() / ref.norm()).item() < 1e-5
    assert not any(args and args[0] for args in synced)  # never the exact-size (sync) build
    bound = n_ref - 4
    ws, rows = tw.build_workspace(swa, sw, kv, tk, True, D, max_slots=bound)
    assert ws.shape == (bound + 2, D)
    over = (rows == bound + 1).any(dim=1)
    assert over.any() and not over.all()
    kept = rows[:, : W + TOPK]
    assert ((kept >= -1) & (kept <= bound + 1)).all()
    out = torch.full((T, H, D), 0.0)
    tri.sparse_attention(
        q, swa, sw, kv, tk, True, sink, D**-0.5, out, max_slots=bound,
        variant="ws_direct_n32", tiles=Tiles(block_h=16, block_n=16, num_warps=4),
    )  # fmt: skip
    assert out[over].isnan().all() and not out[~over].isnan().any()
    assert torch.allclose(out[~over], ref[~over], rtol=1e-5, atol=1e-6)
