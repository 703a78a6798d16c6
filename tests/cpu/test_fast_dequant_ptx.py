"""The sparse-attention kernel's inline-PTX dequantization (`triton_records._FP4_ASM`,
`_E4M3_ASM`), run on the CPU by a small interpreter of the PTX it uses (prmt, shifts, and/or,
mul.rn.bf16x2), over every value byte and a sweep of scale bytes, against the records' own
decoders (`kv.records`): each output is the value times the record's scale times FAST_FACTOR^-1,
exactly. Which tensor elements Triton packs into one call's registers is checked on the GPU
(tests/gpu/test_sparse_attn.py, every variant against the torch reference).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from sglang_dsv41.kernels.sparse_attn import triton_records as tr
from sglang_dsv41.kv import fp as records

M32 = 0xFFFFFFFF


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 patterns (subnormals included) -> float64."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f64_to_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> uint16 bf16 patterns, round to nearest even (the products here are exact)."""
    t = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy()
    return t.view(np.uint16)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """prmt.b32 default mode: output byte k = byte sel[k] (3 bits; bit 3 = sign mode, unused
    here) of the eight bytes b:a."""
    src = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint64)
    for k in range(4):
        s = (sel >> (4 * k)) & 0xF
        assert s < 8, "sign-replicate mode is not used by these kernels"
        out |= ((src >> np.uint64(8 * s)) & np.uint64(0xFF)) << np.uint64(8 * k)
    return out.astype(np.uint32)


def _mul_bf16x2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lo = _f64_to_bf16(_bf16_to_f64(a & 0xFFFF) * _bf16_to_f64(b & 0xFFFF))
    hi = _f64_to_bf16(_bf16_to_f64(a >> 16) * _bf16_to_f64(b >> 16))
    return (hi.astype(np.uint32) << 16) | lo.astype(np.uint32)


def run_ptx(asm: str, operands: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Interpret the straight-line PTX block `asm` over uint32 arrays; `operands` maps "$n" to
    the inputs and receives the outputs."""
    regs = dict(operands)

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return np.uint32(int(tok, 0) & M32)

    body = asm.strip().strip("{}")
    for stmt in filter(None, (s.strip() for s in body.split(";"))):
        if stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        d, *src = [a.strip() for a in args.split(",")]
        if op == "prmt.b32":
            out = _prmt(val(src[0]) * np.ones(1, np.uint32), val(src[1]) * np.ones(1, np.uint32),
                        int(src[2], 0))  # fmt: skip
        elif op == "shl.b32":
            out = (val(src[0]).astype(np.uint64) << int(src[1])) & M32
        elif op == "shr.b32":
            out = val(src[0]) >> np.uint32(int(src[1]))
        elif op == "and.b32":
            out = val(src[0]) & val(src[1])
        elif op == "or.b32":
            out = val(src[0]) | val(src[1])
        elif op == "mul.rn.bf16x2":
            out = _mul_bf16x2(val(src[0]), val(src[1]))
        else:
            raise AssertionError(f"PTX op {op!r} is not modelled")
        regs[d] = np.asarray(out).astype(np.uint32)
    return regs


def _asm(const) -> str:
    return getattr(const, "value", const)


def _pairs(vals: np.ndarray) -> np.ndarray:
    """bf16 patterns [..., 2] -> uint32 registers, element 0 in the low half."""
    return vals[..., 0].astype(np.uint32) | (vals[..., 1].astype(np.uint32) << 16)


def _halves(reg: np.ndarray) -> np.ndarray:
    return np.stack([reg & 0xFFFF, reg >> 16], -1)


def test_the_interpreter_models_prmt_and_bf16x2():
    a = np.array([0x44332211], np.uint32)
    b = np.array([0x88776655], np.uint32)
    assert _prmt(a, b, 0x3120)[0] == 0x44223311
    assert _prmt(a, b, 0x7654)[0] == 0x88776655
    one, half_sub = 0x3F80, 0x0040  # 1.0, and 2^-127 (a subnormal bf16), times 1 and 2^126
    two_126 = 0x7E80
    r = _mul_bf16x2(np.array([one | (half_sub << 16)], np.uint32),
                    np.array([one | (two_126 << 16)], np.uint32))  # fmt: skip
    assert _bf16_to_f64(r & 0xFFFF)[0] == 1.0 and _bf16_to_f64(r >> 16)[0] == 0.5


@pytest.mark.parametrize("scale_lo", [0x00, 0x08, 0x30, 0x38, 0x50, 0x70])
def test_fp4_asm_is_exact_for_every_byte(scale_lo):
    rng = np.random.default_rng(scale_lo)
    n = 4096
    raw = rng.integers(0, 256, size=(n, 4), dtype=np.uint8)
    raw[:256, 0] = np.arange(256)  # every byte, in each position
    raw[256:512, 1] = np.arange(256)
    raw[512:768, 2] = np.arange(256)
    raw[768:1024, 3] = np.arange(256)
    sbytes = rng.integers(scale_lo, min(scale_lo + 16, 0x7F), size=(n, 4), dtype=np.uint8)
    scale = records.e4m3_decode(torch.from_numpy(sbytes)).double().numpy()  # [n, 4]
    mult = _f64_to_bf16(scale * 2.0**118)
    regs = run_ptx(_asm(tr._FP4_ASM), {
        "$4": raw.view(np.uint32)[:, 0],
        "$5": _pairs(mult[:, 0:2]),
        "$6": _pairs(mult[:, 2:4]),
    })  # fmt: skip
    lo = np.concatenate([_halves(regs["$0"]), _halves(regs["$1"])], -1)  # byte i's low nibble
    hi = np.concatenate([_halves(regs["$2"]), _halves(regs["$3"])], -1)
    got = np.stack([_bf16_to_f64(lo), _bf16_to_f64(hi)], -1).reshape(n, 8)  # natural order
    codes = records.e2m1_decode_packed(torch.from_numpy(raw)).double().numpy()  # [n, 8]
    want = codes * np.repeat(scale, 2, axis=1) / tr.FAST_FACTOR
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale_byte", [100, 112, 120, 127, 130, 142])
def test_e4m3_asm_is_exact_for_every_byte(scale_byte):
    rng = np.random.default_rng(scale_byte)
    n = 2048
    raw = rng.integers(0, 256, size=(n, 4), dtype=np.uint8)
    for j in range(4):
        raw[256 * j : 256 * (j + 1), j] = np.arange(256)
    raw[(raw & 0x7F) == 0x7F] = 0x7E  # e4m3fn NaN codes: never written (records saturate)
    s = np.full((n, 4), scale_byte, np.int64)
    s[n // 2 :] = rng.integers(scale_byte - 8, scale_byte + 1, size=(n - n // 2, 4))
    mult = _f64_to_bf16(np.exp2((np.minimum(s, 143) - 15).astype(np.float64)))
    regs = run_ptx(_asm(tr._E4M3_ASM), {
        "$2": raw.view(np.uint32)[:, 0],
        "$3": _pairs(mult[:, 0:2]),
        "$4": _pairs(mult[:, 2:4]),
    })  # fmt: skip
    got = np.concatenate([_halves(regs["$0"]), _halves(regs["$1"])], -1)
    got = _bf16_to_f64(got)
    vals = records.e4m3_decode(torch.from_numpy(raw)).double().numpy()
    want = vals * np.exp2((s - 127).astype(np.float64)) / tr.FAST_FACTOR
    np.testing.assert_array_equal(got, want)


def test_the_multipliers_match_the_kernel_formulas():
    """The multipliers above are what `_fast_v41` / `_fast_v41_fp4` compute (read from the
    source, so a change there fails here)."""
    import inspect

    src = inspect.getsource(tr._fast_v41.fn)
    assert re.search(r"tl\.minimum\(b_s\.to\(tl\.int32\), 143\) \+ 112\) << 23", src)
    src = inspect.getsource(tr._fast_v41_fp4.fn)
    m = re.search(r"\* ([0-9.e]+)\s+# 2\^118", src)
    assert m and float(m.group(1)) == 2.0**118
    assert tr.FAST_FACTOR == 2.0**8
