"""The CUDA sparse-attention kernel without a GPU: every build the plan chooses compiles with
NVRTC for sm_90a (the test environment's PyTorch brings NVRTC) within the registers and local
memory it is meant to use, the build cache, the launcher's argument contract. Which shapes
take it: test_sparse_attn_selection.py; a build that fails: test_sparse_attn_fallback.py. Its
numbers are checked on the GPU (tests/gpu/test_cuda_attn.py, against the torch reference).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

from sglang_dsv41.kernels.sparse_attn import cuda_decode, cuda_jit
from sglang_dsv41.kernels.sparse_attn import plan as plan_mod
from sglang_dsv41.kernels.sparse_attn.cuda_decode import defines_for
from sglang_dsv41.kernels.sparse_attn.variants import Build

CPU = torch.device("cpu")


def _nvrtc_or_skip():
    try:
        cuda_jit.nvrtc_version()
    except cuda_jit.CudaJitError as exc:
        pytest.skip(f"NVRTC is not loadable here: {exc}")


def _resources(cubin: bytes, tmp_path) -> dict:
    """Registers and local (spill) bytes of the kernel, from cuobjdump (Triton ships it)."""
    triton = pytest.importorskip("triton")
    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    text = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    assert m, text
    return {"regs": int(m.group(1)), "stack": int(m.group(2)), "local": int(m.group(3))}


def _source_defines(path: str) -> dict:
    """The integer `#define NAME expr` lines of a kernel source, evaluated in order (expressions
    of earlier names and integers only)."""
    vals: dict = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"#define ([A-Z_0-9]+) ([-+*/() A-Z_0-9]+?)\s*(//.*)?$", line)
            if m:
                try:
                    vals[m.group(1)] = int(eval(m.group(2), {"__builtins__": {}}, dict(vals)))
                except (NameError, SyntaxError):
                    pass
    return vals


def _max_regs(defines: tuple) -> int:
    """Tiles of 16: three blocks of 128 threads per SM (168 registers; 128, four blocks, at up
    to 8 heads in bf16 and in the slim builds); tiles of 32: two (shared memory allows no
    more); the half builds (blocks of 64 threads): five (204) in bf16, four (255) with fp32
    q; the wide builds (blocks of 256 threads): two (128); the warpgroup kernels one block per
    SM (the 64-head one: 384 threads, 168)."""
    if "-DWG64=1" in defines:
        return 168
    if "-DWG=1" in defines:  # one block of 128 (1 + NPW) threads per SM
        return min(255, 65536 // (128 * (1 + cuda_decode._option(defines, "NPW", 1))) // 8 * 8)
    if "-DBN=32" in defines:
        return 255
    if "-DNW=2" in defines:
        return 65536 // (64 * cuda_decode._option(defines, "MIN_BLOCKS", 0)) // 8 * 8 - 1
    if "-DNW=8" in defines:
        return 65536 // (256 * cuda_decode._option(defines, "MIN_BLOCKS", 0)) // 8 * 8
    if defines == ("-DNH=1",) or "-DMIN_BLOCKS=4" in defines:  # the slim build: four
        return 128
    return 168


def test_the_builds_are_the_launchers():
    assert defines_for(Build.TILES16, 8, False) == ("-DNH=1",)
    assert defines_for(Build.TILES16, 5, True) == ("-DEXACT=1", "-DNH=1")
    assert defines_for(Build.TILES32, 16, False) == ("-DNH=2", "-DBN=32", "-DSTAGES=2")
    slim = defines_for(Build.SLIM, 8, True)
    assert slim == ("-DEXACT=1", "-DNH=1", "-DKBUF=1", "-DSTAGES=2", "-DMIN_BLOCKS=4")
    assert 4 * (cuda_decode.smem_bytes(slim) + 1024) <= 228 * 1024  # four blocks per SM
    slim16 = defines_for(Build.SLIM, 16, False)  # three stages, three blocks
    assert slim16 == ("-DNH=2", "-DKBUF=1", "-DSTAGES=3", "-DMIN_BLOCKS=3")
    assert 3 * (cuda_decode.smem_bytes(slim16) + 1024) <= 228 * 1024
    half = defines_for(Build.HALF, 8, False)
    assert half == ("-DNH=1", "-DNW=2", "-DKBUF=1", "-DSTAGES=2", "-DMIN_BLOCKS=5")
    assert cuda_decode.warps(half) == 2 and cuda_decode.warps(slim) == 4
    assert 5 * (cuda_decode.smem_bytes(half) + 1024) <= 228 * 1024  # five blocks per SM
    assert "-DMIN_BLOCKS=4" in defines_for(Build.HALF, 3, True)
    wide = defines_for(Build.WIDE, 16, False)
    assert wide == ("-DNH=2", "-DNW=8", "-DMIN_BLOCKS=2") and cuda_decode.warps(wide) == 8
    assert 2 * (cuda_decode.smem_bytes(wide) + 1024) <= 228 * 1024  # two blocks per SM
    assert defines_for(Build.WIDE, 8, True) == ("-DEXACT=1", "-DNH=1", *wide[1:])
    wg64 = defines_for(Build.WG64, 64, False)
    assert wg64 == ("-DWG64=1", "-DBN=64") and cuda_decode.warps(wg64) == 12
    assert cuda_decode.smem_bytes(wg64) <= 232448
    assert cuda_decode.group_heads(40, False, Build.WG64) == 64
    assert (
        cuda_decode.source(wg64)[1] == "sparse_wg64"
        and cuda_decode.source(half)[1] == "sparse_decode_h16"
    )
    with pytest.raises(ValueError, match="wg64"):
        defines_for(Build.WG64, 64, True)  # bf16 q only
    with pytest.raises(ValueError, match="half"):
        defines_for(Build.HALF, 16, False)  # blocks of 16 heads


def test_the_plan_chooses_thirteen_builds():
    """Tiles of 16 for blocks of 8 heads (bf16 and fp32 q), of 32 for 16 bf16 or 8 fp32 heads,
    the wide build for all three, the slim build for all three, the half build for blocks of 8
    heads, the 64-head kernel."""
    builds = plan_mod.reachable_builds()
    assert len(builds) == len(set(builds)) == 13
    assert defines_for(Build.TILES16, 16, False) not in builds  # measured, never the fastest
    assert defines_for(Build.TILES32, 8, False) not in builds


@pytest.mark.parametrize("defines", plan_mod.reachable_builds())
def test_the_kernel_builds_for_sm90a_without_spills(defines, tmp_path):
    """Every build the plan chooses, within the registers of the blocks per SM it is meant to
    run (`_max_regs`); no local memory."""
    _nvrtc_or_skip()
    path, name = cuda_decode.source(defines)
    cubin = cuda_jit.compile_cubin(cuda_jit.load_source(path), name, "sm_90a", defines)
    r = _resources(cubin, tmp_path)
    assert r["regs"] <= _max_regs(defines) and r["local"] == 0 and r["stack"] == 0, r


def test_a_compile_error_names_the_kernel_and_the_log():
    _nvrtc_or_skip()
    with pytest.raises(cuda_jit.CudaJitError, match=r"could not compile broken(.|\n)*error"):
        cuda_jit.compile_cubin('extern "C" __global__ void broken() { nope; }', "broken", "sm_90a")


def test_builds_are_cached_by_their_inputs(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    monkeypatch.setenv("SGLANG_DSV41_CUDA_CACHE", str(tmp_path))
    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }'
    a = cuda_jit.cached_cubin(src, "k", "sm_90a")
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].startswith("k-sm_90a-")
    (tmp_path / files[0]).write_bytes(b"cached")  # a second call reads the file, not NVRTC
    assert cuda_jit.cached_cubin(src, "k", "sm_90a") == b"cached"
    b = cuda_jit.cached_cubin(src, "k", "sm_90a", ("-DX=1",))
    assert len(os.listdir(tmp_path)) == 2 and a[:4] == b[:4] == b"\x7fELF"


def _args(T=3, H=8, W=5, TOPK=7, fp4=True):
    q = torch.zeros(T, H, 512, dtype=torch.bfloat16)
    swa = torch.zeros(10, 528, dtype=torch.uint8)
    kv = torch.zeros(10, 288 if fp4 else 528, dtype=torch.uint8)
    sw = torch.zeros(T, W, dtype=torch.int32)
    tk = torch.zeros(T, TOPK, dtype=torch.int32)
    return q, swa, sw, kv, tk, fp4


def test_the_argument_contract():
    cuda_decode.check_args(*_args())
    cuda_decode.check_args(*_args(fp4=False))
    q, swa, sw, kv, tk, fp4 = _args()
    cuda_decode.check_args(q.float(), swa, sw, kv, tk, fp4)  # fp32 q: the exact mode
    for H in (17, 64):  # more heads: blocks of 16 (bf16) or 8 (fp32)
        cuda_decode.check_args(torch.zeros(3, H, 512, dtype=torch.bfloat16), swa, sw, kv, tk, fp4)
        cuda_decode.check_args(torch.zeros(3, H, 512), swa, sw, kv, tk, fp4)
    assert [cuda_decode.group_heads(H, False) for H in (1, 8, 9, 64)] == [8, 8, 16, 16]
    assert [cuda_decode.group_heads(H, True) for H in (1, 8, 9, 64)] == [8, 8, 8, 8]
    bad = {
        "no heads": (torch.zeros(3, 0, 512, dtype=torch.bfloat16), swa, sw, kv, tk, fp4),
        "fp16 q": (q.half(), swa, sw, kv, tk, fp4),
        "head dim 256": (q[:, :, :256], swa, sw, kv, tk, fp4),
        "V41 rows for FP4": (q, swa, sw, torch.zeros(10, 528, dtype=torch.uint8), tk, fp4),
        "int64 slots": (q, swa, sw.long(), kv, tk, fp4),
        "off 16 bytes": (q, torch.zeros(10 * 528 + 8, dtype=torch.uint8)[8:].view(10, 528),
                         sw, kv, tk, fp4),
    }  # fmt: skip
    for why, a in bad.items():
        with pytest.raises(ValueError):
            cuda_decode.check_args(*a)
        assert why
    with pytest.raises(ValueError, match="out must be"):
        cuda_decode.check_args(*_args(), out=torch.zeros(3, 8, 512, dtype=torch.float16))
    q, swa, sw, kv, tk, fp4 = _args(W=0)  # an empty segment's cache is never read
    cuda_decode.check_args(q, torch.zeros(1, 1, dtype=torch.uint8), sw, kv, tk, fp4)


def test_shared_memory_per_build():
    """Tiles of 16: two buffers of 4 warps x 16 rows of 272 B, logits 8 KB at 16 heads (4 KB
    at 8: one float4 per lane and warp), 9 KB a stage; three blocks fit an SM (228 KB, 1 KB
    reserved per block). Tiles of 32: one buffer, twice the logits and stages; two blocks.
    Two warps (half): rows of 528 B, 18 KB a stage of 16 records (V41: 256 B of a record per
    warp). Eight warps (wide): rows of 144 B, a stage of 16 records 1152 B a warp (64 B of a
    record and its scale word)."""
    assert cuda_decode.smem_bytes() == 34816 + 8192 + 3 * 9216
    assert cuda_decode.smem_bytes(("-DNH=1",)) == 34816 + 4096 + 3 * 9216
    assert cuda_decode.smem_bytes(("-DSTAGES=4",)) - cuda_decode.smem_bytes() == 9216
    assert 3 * (cuda_decode.smem_bytes() + 1024) <= 228 * 1024
    b32 = defines_for(Build.TILES32, 16, False)
    assert cuda_decode.smem_bytes(b32) == 34816 + 16384 + 2 * 18432
    assert 2 * (cuda_decode.smem_bytes(b32) + 1024) <= 228 * 1024
    half = defines_for(Build.HALF, 8, False)
    assert cuda_decode.smem_bytes(half) == 2 * 16 * 528 + 2048 + 2 * 2 * (8 * 512 + 512)
    wide = defines_for(Build.WIDE, 8, False)
    assert cuda_decode.smem_bytes(wide) == 8 * (2 * 16 * 144 + 1024 + 3 * (1024 + 128))
    # the 64-head kernel: two 64 KB tiles, q (64 x 512 bf16), the entry flags of two buffers;
    # the output rows staged over the tiles and q (64 rows of 520 floats) fit
    wg64 = defines_for(Build.WG64, 64, False)
    lay = _source_defines(cuda_decode._WG64_SRC)  # the kernel's own layout
    assert cuda_decode.smem_bytes(wg64) == lay["SMEM_BYTES"] == 2 * 65536 + 65536 + 512 + 16
    assert 64 * lay["STAGE_ROW"] * 4 <= lay["OFF_OK"]  # the staged output stays off the flags


def test_no_build_on_a_device_without_it(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cuda_decode.why_unavailable(CPU) == "not a CUDA device"
    assert cuda_decode.build_error(defines_for(Build.TILES16, 8, False), CPU) is not None
    assert not cuda_decode._ERRORS  # nothing built, nothing remembered


def test_the_source_ships_with_the_package():
    root = os.path.join(os.path.dirname(cuda_decode._SRC), "..", "..")
    with open(os.path.join(root, "pyproject.toml")) as f:
        text = f.read()
    assert re.search(r'^"sglang_dsv41\.kernels\.sparse_attn" = \["\*\.cu", "\*\.cuh"\]', text, re.M)


def test_includes_are_inlined_once(tmp_path):
    """`load_source` gives NVRTC one string: each `#include "x"` replaced by the file beside the
    source, once; other lines untouched."""
    (tmp_path / "h.cuh").write_text("#pragma once\nint h;")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n#include "h.cuh"\nint k;  // x\n')
    assert cuda_jit.load_source(str(tmp_path / "k.cu")) == "#pragma once\nint h;\nint k;  // x\n"
    src = cuda_jit.load_source(cuda_decode._SRC)
    assert "#include" not in src and "fp4_word" in src
