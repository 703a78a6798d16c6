"""The whole sparse-attention selection, pinned: for every availability (CUDA builds load or not,
flash_mla installed or not), both query dtypes, heads per GPU in 4..128 and every T in 1..4096,
the plan names the variant and launches exactly what `sparse_attn_selection.txt` says (the
selection as measured on the H200). A refactor that changes any launch fails here."""

from __future__ import annotations

import os
import re

import pytest
import torch

pytest.importorskip("triton")

from sglang_dsv41.kernels.sparse_attn import plan as plan_mod  # noqa: E402
from sglang_dsv41.kernels.sparse_attn.cuda_decode import defines_for  # noqa: E402
from sglang_dsv41.kernels.sparse_attn.variants import Cuda, FlashMla  # noqa: E402

CPU = torch.device("cpu")
PIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse_attn_selection.txt")
_ROW = re.compile(r"(no-)?cuda (no-)?flashmla (bf16|fp32) H=(\d+) T=(\d+)-(\d+): (\w+) \| (.*)$")
_SMALL = re.compile(r"(gpu|interpret) D=(\d+) (bf16|fp32) H=(\d+): (.*)$")


def _pin() -> tuple[dict, list]:
    """({(cuda, flashmla, exact, H): [(T0, T1, name, launch)]}, [(interpret, D, exact, H,
    launch)]) from the pin file."""
    table: dict = {}
    small = []
    with open(PIN) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            m = _ROW.match(line.strip())
            if m:
                key = (not m[1], not m[2], m[3] == "fp32", int(m[4]))
                table.setdefault(key, []).append((int(m[5]), int(m[6]), m[7], m[8]))
                continue
            m = _SMALL.match(line.strip())
            assert m, line
            small.append((m[1] == "interpret", int(m[2]), m[3] == "fp32", int(m[4]), m[5]))
    return table, small


def _launch(plan, H: int, exact: bool) -> str:
    """What a plan launches, in the pin's words."""
    spec = plan.spec
    if isinstance(spec, Cuda):
        return f"cuda {' '.join(defines_for(spec.build, H, exact))} per_sm={spec.per_sm}"
    if isinstance(spec, FlashMla):
        return f"flashmla private={int(spec.private)}"
    t = plan.tiles
    assert plan.num_splits is None
    return (
        f"triton ws={int(spec.workspace)} bh={t.block_h} bn={t.block_n} nw={t.num_warps} "
        f"st={t.num_stages} swap={int(t.swap)} skew={int(t.skew)} pf={int(t.prefetch)} "
        f"per_sm={spec.per_sm} ieee={int(spec.ieee)}"
    )


# the pin's names that the vocabulary merged: at 17-32 bf16 heads and for fp32 q the same
# variant; the pin keeps what each launched
RENAMED = {"swap_w8_n32_pf_bh16": "swap_w8_n32_pf"}


TABLE, SMALL = _pin()


@pytest.mark.parametrize("cuda_ok, flashmla_ok, exact, H", sorted(TABLE))
def test_every_shape_launches_what_was_measured(cuda_ok, flashmla_ok, exact, H, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(plan_mod, "_cuda_error", lambda defines, device: None if cuda_ok else "no")
    monkeypatch.setattr(plan_mod, "_flashmla_ok", lambda device: flashmla_ok)
    rows = TABLE[(cuda_ok, flashmla_ok, exact, H)]
    assert rows[0][0] == 1 and rows[-1][1] == 4096
    assert all(a[1] + 1 == b[0] for a, b in zip(rows, rows[1:], strict=False))
    for t0, t1, name, want in rows:
        plan = plan_mod.plan_for(t0, H, 512, CPU, exact)
        assert plan.variant.value == RENAMED.get(name, name), (t0, H, exact)
        for T in range(t0, t1 + 1):
            got = _launch(plan_mod.plan_for(T, H, 512, CPU, exact), H, exact)
            assert got == want, (T, H, exact, cuda_ok, flashmla_ok)


def test_small_head_dims_and_the_interpreter(monkeypatch):
    for interpret, D, exact, H, want in SMALL:
        if interpret:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        else:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        assert _launch(plan_mod.plan_for(40, H, D, CPU, exact), H, exact) == want, (D, H, exact)
