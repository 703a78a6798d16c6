"""Sparse attention over V4.1 records (ours, Triton) vs FlashMLA SM90 (V4 584 B records), one run.

Decode: batch 1/8/32/128, one query token per request, 64 heads x 512, SWA window 128 + top-512,
sink. Ours reads V41 (528 B) SWA records and V41_FP4 (288 B) or V41 main-KV records; FlashMLA's
legacy sparse decode reads V4 584 B records for both (`k_cache` + `extra_k_cache`).
Prefill: 4096 queries x (128 + 512) indices, 64 heads; FlashMLA's `flash_mla_sparse_fwd` reads
bf16 KV. Times are medians of `triton.testing.do_bench` (L2 flushed before each call).
Also prints the machine's copy bandwidth and bf16 matmul rate, the ceilings of the roofline.

    python benchmarks/bench_attention.py [--json out.json] [--sweep]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from sglang_dsv41.kernels.args import SparseKV
from sglang_dsv41.kernels.sparse_attn import sparse_attention
from sglang_dsv41.kernels.sparse_attn import triton as sa
from sglang_dsv41.kv.records import Layout, record_bytes

H, D, W, TOPK = 64, 512, 128, 512
DEV = torch.device("cuda")
CONFIGS = [  # (block_h, block_n, num_warps, num_stages)
    (64, 32, 8, 1),
    (64, 64, 8, 1),
    (64, 16, 8, 1),
    (16, 32, 4, 1),
]


def bench(fn) -> float:
    """Median microseconds of fn()."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def bench_graph(fn) -> float:
    """Median microseconds of one CUDA-graph replay of fn() (no host launch overhead)."""
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return bench(g.replay)


def ceilings() -> dict:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    t_copy = bench(lambda: b.copy_(a))
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t_mm = bench(lambda: x @ y)
    return {"copy_TBps": 2 * n / t_copy / 1e6, "bf16_TFLOPs": 2 * 8192**3 / t_mm / 1e6}


def random_records(n: int, nbytes: int) -> torch.Tensor:
    """uint8 [n, nbytes] of finite-looking bytes (no NaN codes); values do not affect timing."""
    return torch.randint(0, 0x70, (n, nbytes), dtype=torch.uint8, device=DEV)


def decode_case(B: int, ctx_entries: int = 4096):
    """Slot lists of B decode tokens: a private window of 128 and a top-512 of ctx_entries each."""
    swa_slots = torch.randperm(B * 1024, device=DEV)[: B * W].view(B, W).to(torch.int32)
    base = (torch.arange(B, device=DEV) * ctx_entries)[:, None]
    pick = torch.rand(B, ctx_entries, device=DEV).argsort(dim=1)[:, :TOPK]
    topk_slots = (base + pick).to(torch.int32)  # [B, TOPK]
    return swa_slots, topk_slots, B * 1024, B * ctx_entries


def work(T: int, main_bytes: int, swa_bytes: int, out_bytes: int = 2) -> tuple[float, float]:
    """(FLOP, bytes) of T tokens: QK and PV over W + TOPK entries; q, out, records, indices."""
    flop = 4.0 * T * H * D * (W + TOPK)
    nbytes = T * (
        H * D * 2 + H * D * out_bytes + W * swa_bytes + TOPK * main_bytes + (W + TOPK) * 4
    )
    return flop, nbytes


def ours_decode(B, layout, cfg=None):
    swa_slots, topk_slots, n_swa, n_kv = decode_case(B)
    swa = random_records(n_swa, 528)
    kv = random_records(n_kv, record_bytes(layout, D))
    q = torch.randn(B, H, D, device=DEV, dtype=torch.bfloat16)
    sink = torch.randn(H, device=DEV)
    out = torch.empty(B, H, D, device=DEV, dtype=torch.bfloat16)
    launch = (
        {}
        if cfg is None
        else dict(block_h=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])
    )
    b = SparseKV(swa, swa_slots, kv, topk_slots, layout)
    fn = lambda: sparse_attention(q, b, sink, out=out, **launch)
    fn()
    return bench(fn), bench_graph(fn)


def flashmla_decode(B):
    import flash_mla

    swa_slots, topk_slots, n_swa, n_kv = decode_case(B)
    page = 64
    k_cache = random_records(n_swa, 584).view(n_swa // page, page, 1, 584)
    extra = random_records(n_kv, 584).view(n_kv // page, page, 1, 584)
    q = torch.randn(B, 1, H, D, device=DEV, dtype=torch.bfloat16)
    sink = torch.randn(H, device=DEV)
    meta, _ = flash_mla.get_mla_metadata()
    fn = lambda: flash_mla.flash_mla_with_kvcache(  # noqa
        q,
        k_cache,
        None,
        None,
        D,
        meta,
        softmax_scale=D**-0.5,
        indices=swa_slots.view(B, 1, W),
        attn_sink=sink,
        extra_k_cache=extra,
        extra_indices_in_kvcache=topk_slots.view(B, 1, TOPK),
        use_legacy=True,
    )
    fn()
    t = bench(fn)
    try:
        return t, bench_graph(fn)
    except Exception as exc:
        print(f"  FlashMLA decode graph capture failed: {str(exc)[:200]}")
        return t, float("nan")


def flashmla_decode_v41(B):
    """FlashMLA's legacy decode asked for V4.1 records (528 B SWA + 288 B main); may refuse SM90."""
    import flash_mla

    swa_slots, topk_slots, n_swa, n_kv = decode_case(B)
    page = 64
    k_cache = random_records(n_swa, 528).view(n_swa // page, page, 1, 528)
    extra = random_records(n_kv, 288).view(n_kv // page, page, 1, 288)
    q = torch.randn(B, 1, H, D, device=DEV, dtype=torch.bfloat16)
    sink = torch.randn(H, device=DEV)
    meta, _ = flash_mla.get_mla_metadata()
    fn = lambda: flash_mla.flash_mla_with_kvcache(  # noqa
        q,
        k_cache,
        None,
        None,
        D,
        meta,
        softmax_scale=D**-0.5,
        indices=swa_slots.view(B, 1, W),
        attn_sink=sink,
        extra_k_cache=extra,
        extra_indices_in_kvcache=topk_slots.view(B, 1, TOPK),
        use_legacy=True,
    )
    fn()
    return bench(fn)


def prefill_case(T: int, ctx_tokens: int):
    """T query tokens at the end of one ctx_tokens prompt: windows over tokens, top-512 entries."""
    pos = torch.arange(ctx_tokens - T, ctx_tokens, device=DEV)
    swa_slots = (pos[:, None] - torch.arange(W - 1, -1, -1, device=DEV)[None]).to(torch.int32)
    n_entries = ctx_tokens // 2
    topk_slots = torch.rand(T, n_entries, device=DEV).topk(TOPK, dim=1).indices.to(torch.int32)
    return swa_slots, topk_slots, ctx_tokens, n_entries


def ours_prefill(T, layout, cfg=None, ctx_tokens=16384):
    swa_slots, topk_slots, n_swa, n_kv = prefill_case(T, ctx_tokens)
    swa = random_records(n_swa, 528)
    kv = random_records(n_kv, record_bytes(layout, D))
    q = torch.randn(T, H, D, device=DEV, dtype=torch.bfloat16)
    sink = torch.randn(H, device=DEV)
    out = torch.empty(T, H, D, device=DEV, dtype=torch.bfloat16)
    launch = (
        {}
        if cfg is None
        else dict(block_h=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])
    )
    b = SparseKV(swa, swa_slots, kv, topk_slots, layout)
    fn = lambda: sparse_attention(q, b, sink, out=out, **launch)
    fn()
    return bench(fn)


def flashmla_prefill(T, ctx_tokens=16384):
    import flash_mla

    swa_slots, topk_slots, n_swa, n_kv = prefill_case(T, ctx_tokens)
    kv = torch.randn(n_swa + n_kv, 1, D, device=DEV, dtype=torch.bfloat16)
    idx = torch.cat((swa_slots, topk_slots + n_swa), dim=1).view(T, 1, W + TOPK).contiguous()
    q = torch.randn(T, H, D, device=DEV, dtype=torch.bfloat16)
    sink = torch.randn(H, device=DEV)
    fn = lambda: flash_mla.flash_mla_sparse_fwd(
        q,
        kv,
        idx,
        D**-0.5,
        D,
        attn_sink=sink,  # noqa
        use_legacy=True,
    )
    fn()
    return bench(fn)


@triton.jit
def _ablate_kernel(
    q_ptr,
    kv_ptr,
    kv_stride,
    idx_ptr,
    o_ptr,
    N,
    qk_scale,
    D: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    MODE: tl.constexpr,
):
    """Prefill-shaped FP4 attention over N entries per token with stages left out (timing only).

    MODE 0: everything; 1: gather + dequantize, no MMA/softmax; 2: MMA + softmax on a synthetic
    tile, no gather/dequantize; 3: gather only.
    """
    i_t = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, D)
    b_q = tl.load(q_ptr + i_t * BH * D + o_h[:, None] * D + o_d[None, :])  # [BH, D]
    m_i = tl.full([BH], -1e30, tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)
    keep = tl.zeros([D], tl.float32)
    n_t = tl.cdiv(N, BN)
    for u in range(0, n_t):
        idx = sa._load_idx(idx_ptr + i_t * N, u, N, BN)
        if MODE == 2:
            b_k = ((idx[:, None] + o_d[None, :]) & 7).to(tl.bfloat16)
        else:
            b_v, b_s = sa._raw_v41_fp4(kv_ptr, kv_stride, idx, D)
            if MODE == 3:
                keep += tl.sum(tl.sum(tl.sum(b_v.to(tl.float32), 2), 1), 0)
                b_k = tl.zeros([BN, D], tl.bfloat16)
            else:
                b_k = sa._deq_v41_fp4(b_v, b_s, D, BN, tl.bfloat16)
        if MODE == 0 or MODE == 2:
            m_i, l_i, acc = sa._attend_tile(b_q, b_k, idx >= 0, m_i, l_i, acc, qk_scale)
        elif MODE == 1:
            keep += tl.sum(b_k.to(tl.float32), 0)
    o = acc / l_i[:, None] + keep[None, :]
    tl.store(o_ptr + i_t * BH * D + o_h[:, None] * D + o_d[None, :], o.to(tl.bfloat16))


def ablation(T: int = 4096, N: int = 640) -> dict:
    """us per call of _ablate_kernel in each MODE (BH 64, BN 32, 8 warps, FP4 records)."""
    kv = random_records(T * 2, 288)
    idx = torch.randint(0, T * 2, (T, N), device=DEV, dtype=torch.int32)
    q = torch.randn(T, H, D, device=DEV, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    res = {}
    for mode, name in enumerate(["full", "no_mma", "no_gather_dequant", "gather_only"]):
        fn = lambda: _ablate_kernel[(T,)](
            q,
            kv,
            kv.stride(0),
            idx,
            o,
            N,
            0.06,
            D=D,
            BH=H,  # noqa
            BN=32,
            MODE=mode,
            num_warps=8,
        )
        fn()
        res[name] = bench(fn)
    return res


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # a peer that cannot run is reported, not fatal
        print(f"  {fn.__name__}{args[:2]}: {type(exc).__name__}: {str(exc)[:300]}")
        return (float("nan"), float("nan")) if "decode" in fn.__name__ else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="time every launch config")
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--ablate", action="store_true", help="time kernel stages left out")
    args = ap.parse_args()
    res = {
        "device": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "torch": torch.__version__,
    }
    res["ceilings"] = ceil = ceilings()
    print(f"ceilings: copy {ceil['copy_TBps']:.2f} TB/s, bf16 mm {ceil['bf16_TFLOPs']:.0f} TFLOP/s")

    batches = [1, 8, 32, 128]
    if args.sweep:
        res["sweep"] = {}
        for cfg in CONFIGS:
            row = [_try(ours_decode, B, Layout.V41_FP4, cfg)[1] for B in batches]
            row.append(_try(ours_prefill, args.prefill_tokens, Layout.V41_FP4, cfg))
            res["sweep"][str(cfg)] = row
            print(
                "sweep (graph us: decode 1/8/32/128, prefill)",
                cfg,
                " ".join(f"{t:8.1f}" for t in row),
            )

    if args.ablate:
        res["ablation"] = ab = _try(ablation)
        print("ablation (us, prefill 4096 x 640 FP4):", ab)

    rows = []
    for B in batches:
        p_fp4, g_fp4 = _try(ours_decode, B, Layout.V41_FP4)
        p_v41, g_v41 = _try(ours_decode, B, Layout.V41)
        p_fm, g_fm = _try(flashmla_decode, B)
        if B == 1:
            _try(flashmla_decode_v41, B)
        flop, by_fp4 = work(B, 288, 528)
        _, by_v41 = work(B, 528, 528)
        _, by_fm = work(B, 584, 584)
        rows.append(
            dict(
                batch=B,
                ours_fp4_us=g_fp4,
                ours_v41_us=g_v41,
                flashmla_us=g_fm,
                plain_ours_fp4_us=p_fp4,
                plain_ours_v41_us=p_v41,
                plain_flashmla_us=p_fm,
                ours_fp4_TBps=by_fp4 / g_fp4 / 1e6,
                ours_fp4_TFLOPs=flop / g_fp4 / 1e6,
                ours_v41_TBps=by_v41 / g_v41 / 1e6,
                flashmla_TBps=by_fm / g_fm / 1e6,
                flashmla_TFLOPs=flop / g_fm / 1e6,
                ratio_fp4=g_fp4 / g_fm,
                ratio_v41=g_v41 / g_fm,
            )
        )
    res["decode"] = rows
    T = args.prefill_tokens
    t_p = _try(ours_prefill, T, Layout.V41_FP4)
    t_p41 = _try(ours_prefill, T, Layout.V41)
    t_pf = _try(flashmla_prefill, T)
    flop, _ = work(T, 288, 528)
    res["prefill"] = dict(
        tokens=T,
        ours_fp4_us=t_p,
        ours_v41_us=t_p41,
        flashmla_us=t_pf,
        ours_fp4_TFLOPs=flop / t_p / 1e6,
        ours_v41_TFLOPs=flop / t_p41 / 1e6,
        flashmla_TFLOPs=flop / t_pf / 1e6,
        ratio_fp4=t_p / t_pf,
    )

    print("\ndecode, graph replay us (plain launch us)")
    print(
        "  batch | ours fp4       | ours v41       | FlashMLA v4    | fp4/FM | TFLOP/s ours/FM"
        " | TB/s ours/FM"
    )
    for r in rows:
        print(
            f"  {r['batch']:4d} | {r['ours_fp4_us']:6.1f} ({r['plain_ours_fp4_us']:5.1f}) | "
            f"{r['ours_v41_us']:6.1f} ({r['plain_ours_v41_us']:5.1f}) | "
            f"{r['flashmla_us']:6.1f} ({r['plain_flashmla_us']:5.1f}) | {r['ratio_fp4']:6.2f} | "
            f"{r['ours_fp4_TFLOPs']:5.0f} / {r['flashmla_TFLOPs']:5.0f} | "
            f"{r['ours_fp4_TBps']:4.2f} / {r['flashmla_TBps']:4.2f}"
        )
    p = res["prefill"]
    print(
        f"prefill {T} x 640: ours fp4 {p['ours_fp4_us']:.0f} us ({p['ours_fp4_TFLOPs']:.0f} "
        f"TFLOP/s), ours v41 {p['ours_v41_us']:.0f} us, FlashMLA bf16 {p['flashmla_us']:.0f} us "
        f"({p['flashmla_TFLOPs']:.0f} TFLOP/s), ratio {p['ratio_fp4']:.2f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
