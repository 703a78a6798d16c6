"""The sparse-attention plan (kernels/sparse_attn/plan.py) on the CPU: every variant left is one
some shape chooses, the choices' invariants, the one-command table (and that
docs/hopper_attention.md shows it), and the launcher's refusals. The whole selection is pinned
in test_sparse_attn_selection.py; the kernels run under the interpreter in
test_sparse_attn_ref.py and on the GPU in tests/gpu/test_sparse_attn.py."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from sglang_dsv41.kernels.sparse_attn import plan as plan_mod  # noqa: E402
from sglang_dsv41.kernels.sparse_attn import triton as tri  # noqa: E402
from sglang_dsv41.kernels.sparse_attn.variants import (  # noqa: E402
    SPECS,
    Cuda,
    FlashMla,
    Tiles,
    Triton,
    Variant,
    plan_of,
)

CPU = torch.device("cpu")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_every_variant_is_chosen_for_some_shape():
    """No variant stays in the tree that the plan never picks: at D = 512 for the table's head
    counts (fallbacks included), or at small head dims / under the interpreter."""
    chosen = {v for H in plan_mod.HEADS for x in (False, True) for v in plan_mod.variants_at(H, x)}
    chosen |= {v for x in (False, True) for v in plan_mod.choices(40, 8, 64, x)}
    assert chosen == set(Variant) == set(SPECS)


@pytest.mark.parametrize("H", [1, 8, 12, 16, 24, 32, 48, 64, 96, 128])
@pytest.mark.parametrize("exact", [False, True])
def test_choices_end_in_a_triton_variant_and_fit_fp32_q(H, exact):
    """The last choice always runs where the launcher does (Triton); fp32 q never takes FlashMLA
    (bf16 q) or SKEW, and its Triton programs hold 16 heads (three q parts of 32 or 64 need
    more than the SM's shared memory); at most one CUDA choice, always first."""
    for T in (1, 2, 3, 7, 8, 31, 32, 39, 40, 127, 128, 1023, 1024, 4096):
        c = plan_mod.choices(T, H, 512, exact)
        assert isinstance(SPECS[c[-1]], Triton), (T, H, c)
        assert all(not isinstance(SPECS[v], Cuda) for v in c[1:]), (T, H, c)
        if exact:
            assert not any(isinstance(SPECS[v], FlashMla) for v in c), (T, H, c)
            tiles = plan_of(c[-1], H, True).tiles
            assert tiles.block_h == 16 and not tiles.skew, (T, H, tiles)


def test_small_head_dims_keep_ieee_products(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert plan_mod.plan_for(40, 4, 64, CPU, True).variant is Variant.PLAIN_N32_IEEE
    assert plan_mod.plan_for(40, 4, 64, CPU, False).variant is Variant.PLAIN_N32
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter exercises the three parts
    assert plan_mod.plan_for(40, 4, 64, CPU, True).variant is Variant.PLAIN_N32
    assert plan_mod.plan_for(40, 64, 512, CPU, True).variant is Variant.PLAIN_N32


def test_a_cuda_choice_gives_way_where_it_cannot_run(monkeypatch):
    """No CUDA device (or a call the CUDA kernel cannot take, `cuda=False`): the next choice;
    no flash_mla: the one after FlashMLA."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert plan_mod.choices(64, 8, 512, False)[0] is Variant.CUDA_SLIM_X3
    assert plan_mod.plan_for(64, 8, 512, CPU, False).variant is Variant.DIRECT_N32_PF_X2
    monkeypatch.setattr(plan_mod, "_cuda_error", lambda defines, device: None)
    assert plan_mod.plan_for(64, 8, 512, CPU, False).variant is Variant.CUDA_SLIM_X3
    got = plan_mod.plan_for(64, 8, 512, CPU, False, cuda=False).variant
    assert got is Variant.DIRECT_N32_PF_X2
    assert plan_mod.plan_for(300, 64, 512, CPU, False, cuda=False).variant is Variant.SKEW64_N32
    monkeypatch.setattr(plan_mod, "_flashmla_ok", lambda device: True)
    got = plan_mod.plan_for(300, 64, 512, CPU, False, cuda=False).variant
    assert got is Variant.FLASHMLA_PRIVATE


def _cli(*args: str) -> str:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-m", "sglang_dsv41.kernels.sparse_attn.plan", *args],
        capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip


def test_one_command_answers_which_kernel_runs():
    out = _cli("--heads", "8,64", "--exact")
    assert out.splitlines()[0] == "| q | heads | tokens | variants, best first |"
    assert "| fp32 | 8 | 128-1023 | cuda_slim_x4, direct_n32_x2 |" in out
    assert "| fp32 | 64 | 1024+ | cuda_half_x4, ws_direct_n32 |" in out
    assert "bf16" not in out
    assert out.strip() == plan_mod.markdown((8, 64), (True,))


def test_the_doc_shows_the_commands_table():
    """docs/hopper_attention.md holds the output of the command its marker names, unedited."""
    with open(os.path.join(ROOT, "docs", "hopper_attention.md")) as f:
        doc = f.read()
    begin = "<!-- plan table: python -m sglang_dsv41.kernels.sparse_attn.plan --both -->\n"
    end = "<!-- end of the plan table -->"
    assert begin in doc and end in doc
    shown = doc.split(begin, 1)[1].split(end, 1)[0]
    assert shown.strip() == _cli("--both").strip()


def _args(T=2, H=8, fp32=True):
    q = torch.zeros(T, H, 512, dtype=torch.float32 if fp32 else torch.bfloat16)
    rec = torch.zeros(4, 288, dtype=torch.uint8)
    sw = torch.zeros(T, 0, dtype=torch.int32)
    tk = torch.zeros(T, 4, dtype=torch.int32)
    return (q, rec, sw, rec, tk, True, None, 0.125, None)


def test_launcher_refusals(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = _args()  # fp32 q at D = 512: the three-part exact path
    skew = Tiles(block_h=16, block_n=32, num_warps=4, skew=True)
    with pytest.raises(ValueError, match="neither the FlashMLA route nor SKEW"):
        tri.sparse_attention(*args, tiles=skew)
    with pytest.raises(ValueError, match="neither the FlashMLA route nor SKEW"):
        tri.sparse_attention(*args, variant="flashmla")
    with pytest.raises(ValueError, match="block_n >= 32"):  # wrong output on the H200
        tri.sparse_attention(*args, tiles=Tiles(block_h=16, block_n=16, num_warps=4))
    with pytest.raises(ValueError, match="unknown variant 'cuda_wg_x1'"):
        tri.sparse_attention(*args, variant="cuda_wg_x1")
    with pytest.raises(ValueError, match="tiles apply to the Triton variants, not to cuda_x2"):
        tri.sparse_attention(*args, variant="cuda_x2", tiles=skew)
    with pytest.raises(ValueError, match="not to flashmla"):  # the plan's non-CUDA choice
        monkeypatch.setattr(plan_mod, "_flashmla_ok", lambda device: True)
        tri.sparse_attention(*_args(T=1024, H=32, fp32=False), tiles=skew)
    from sglang_dsv41.kernels.sparse_attn.cuda_decode import CudaJitError

    with pytest.raises(CudaJitError, match="cuda_x2 cannot run here: not a CUDA device"):
        tri.sparse_attention(*args, variant="cuda_x2")  # asked for by name: runs or raises
