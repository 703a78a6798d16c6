"""benchmarks/bench_decode_stack.py --dry-run: the whole-stack decode step runs on CPU through the
kernel dispatchers (torch references) for both layouts, skips what exceeds the KV budget, and
reports the byte figures of both layouts (hand-computed here, not from the calculator)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.kernels import dispatch
from sglang_dsv41.kernels.args import IndexerGeometry
from sglang_dsv41.kernels.indexer import ref
from sglang_dsv41.kernels.indexer import testing as tt
from sglang_dsv41.tools.kv_capacity import dsv41_footprint, v4_footprint

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_decode_stack.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import decode_stack  # noqa: E402

# tiny preset: kv sources L1, L3 (ratio 2) and L6 (ratio 1); D = 64, R = 16, DI = 32.
# V41_FP4 32 + 4 = 36 B, index K 16 + 1 = 17 B; V4: 48 e4m3 + 16 bf16 + 1 scale = 81 -> 88 B.
TINY_OURS = (36 + 17) * (0.5 + 0.5 + 1)  # 106 B/token
TINY_V4 = (88 + 17) * (0.5 + 0.5 + 1)  # 210 B/token


def test_flash_bytes_per_token_goal():
    """V4.1-Flash: 890 B/token (docs/design.md 2.4) against V4's 2.5 x (584 + 68) = 1630."""
    cfg = preset("flash")
    ours, up = dsv41_footprint(cfg).per_token, v4_footprint(cfg).per_token
    assert (ours, up) == (890, 1630)
    assert ours / up <= 1 / 1.8


def test_dry_run(tmp_path):
    out = tmp_path / "stack.json"
    # 50 KB: (B 1, ctx 64) runs both layouts, (1, 256) only ours, batch 3 neither
    r = subprocess.run(
        [sys.executable, str(BENCH), "--dry-run", "--json", str(out), "--budget-gb", "0.00005"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["dry_run"] and not res["flash_mla"]
    assert res["roles"] == {"full": 3, "reindex": 2, "reuse": 6, "swa": 1}
    assert res["bytes_per_token"] == {"ours": TINY_OURS, "upstream": TINY_V4}
    rows = {(row["B"], row["ctx"]): row for row in res["rows"]}
    assert sorted(rows) == [(1, 64), (1, 256), (3, 64), (3, 256)]
    for key, ran in {(1, 64): ("ours", "upstream"), (1, 256): ("ours",)}.items():
        row = rows[key]
        assert row["ours_us"] > 0 and row["ours_finite"]
        assert row["ours_reindex_layers"] == [8, 10]
        assert row["ours_reindex_agree"] == 1.0 and row["ours_reindex_in_pool"]
        assert row["bytes_per_token_ratio"] == TINY_OURS / TINY_V4
        if "upstream" in ran:  # no FlashMLA on CPU: everything but attention ran, untimed
            assert row["upstream_finite"] and row["upstream_us"] is None
            assert row["upstream_note"].startswith("unavailable")
        else:
            assert row["upstream_note"].startswith("skipped") and "upstream_us" not in row
    for key in ((3, 64), (3, 256)):
        assert "ours_us" not in rows[key] and rows[key]["ours_note"].startswith("skipped")
    assert "| 1 | 64 |" in r.stdout


@pytest.mark.triton_interpret
def test_whole_context_reindex_selects_the_pooled_set(monkeypatch):
    """Upstream's Reindex on the Triton path (scan every entry, mask blocks outside the pool,
    torch top-k of the allowed blocks, rescore them) selects the reference's mask-and-topk set
    up to ties, pools with -1 padding and a query that sees nothing included."""
    pytest.importorskip("triton")
    monkeypatch.setattr(dispatch, "device_paths", lambda device: (dispatch.Path.TRITON,))
    c = tt.random_case(T=4, B=2, n_max=256, P=8, seed=3)
    qI, w, kv = tt.case_args(c)
    g = torch.Generator().manual_seed(4)
    pool = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(4)]).int()
    pool[1, 4:] = -1
    geo = IndexerGeometry(topk=16, pool_blocks=6, block=8)
    ids = decode_stack.reindex_whole_context(qI, w, kv, pool, geo)
    want = ref.reindex_ref(qI, w, kv, pool, geo)
    key = tt.pool_key(ref.paged_scores(qI, w, kv), pool)
    tt.check_selection(ids, want, key, tt.rounding_bound(c), "whole-context reindex")
