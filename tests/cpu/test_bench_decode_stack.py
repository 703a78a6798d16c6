"""benchmarks/bench_decode_stack.py: ours is the served path over a pool laid out as SGLang's
allocators would, and the dry run.

The dry run runs the whole-stack decode step on CPU through the kernel dispatchers (torch
references) for both layouts, skips what exceeds the KV budget, and reports the byte figures of
both layouts (hand-computed here, not from the calculator). The served stack's own tests show
that the step is `serving.attention.attention_layer` once per layer, that a request's output
depends on its own pages and window only (the slot table and the full -> SWA mapping lead the
served path to the records the bench laid out), and that its stores land in the request's
mapped slots.
"""

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
import decode_stack as ds  # noqa: E402
import decode_stack_upstream as dsu  # noqa: E402

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
    assert res["ours_path"].startswith("served") and res["page_size"] == 64
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
    ids = dsu.reindex_whole_context(qI, w, kv, pool, geo)
    want = ref.reindex_ref(qI, w, kv, pool, geo)
    key = tt.pool_key(ref.paged_scores(qI, w, kv), pool)
    tt.check_selection(ids, want, key, tt.rounding_bound(c), "whole-context reindex")


B, CTX = 3, 64


def _stack(cfg, replay=False, attn_dtype=torch.bfloat16):
    layers = ds.build_layers(cfg, "cpu", torch.float32)
    model = ds.StackModel(cfg, layers, B, "cpu", torch.float32)
    return ds.served_stack(model, B, CTX, "cpu", replay=replay, attn_dtype=attn_dtype, seed=5)


def _snapshot(pool):
    return [t.clone() for t in pool.tensors()]


def _restore(pool, snap):
    for t, s in zip(pool.tensors(), snap, strict=True):
        t.copy_(s)


def _own_rows(stack, r):
    """Request slot r's rows: {tensor id: bool mask over its first dim}."""
    pool, cfg = stack.pool, stack.model.cfg
    full = stack.r2t[r].long()
    W = cfg.sliding_window
    own = {}
    for s in pool.main:
        m = torch.zeros(pool.main[s].shape[0], dtype=torch.bool)
        m[full // cfg.ratio(s)] = True
        own[id(pool.main[s])] = own[id(pool.index_k[s])] = m
    swa = pool.swa_slot_of(full[-W:])
    for t in pool.swa:
        if t is not None:
            m = torch.zeros(t.shape[0], dtype=torch.bool)
            m[swa] = True
            own[id(t)] = m
    for t in list(pool.ring.values()) + list(pool.pending.values()):
        m = torch.zeros(t.shape[0], dtype=torch.bool)
        m[r] = True
        own[id(t)] = m
    return own


@torch.no_grad()
@pytest.mark.parametrize("replay", [False, True])
def test_served_stack_reads_its_own_records(monkeypatch, replay):
    """Request 1's output is unchanged when every record of the other requests is redrawn, and
    changes when one record of its own window does; each layer runs the served attention."""
    from sglang_dsv41.serving import attention, layer_loop

    cfg = preset("tiny")
    stack = _stack(cfg, replay)
    pool, calls = stack.pool, []
    inner = attention.attention_layer
    monkeypatch.setattr(
        layer_loop, "attention_layer", lambda a, *x: calls.append(a.layer_id) or inner(a, *x)
    )
    snap = _snapshot(pool)
    out1 = stack.step()
    assert calls == list(range(cfg.num_hidden_layers))
    assert torch.isfinite(out1).all()
    _restore(pool, snap)
    own = _own_rows(stack, 1)
    g = torch.Generator().manual_seed(9)
    for t in pool.tensors():
        if id(t) in own and t.dtype == torch.uint8:
            other = ds.fill_records(t.clone(), None, g)
            t[~own[id(t)]] = other[~own[id(t)]]
        elif id(t) in own:
            t[~own[id(t)]] = torch.randn_like(t)[~own[id(t)]]
    out2 = stack.step()
    torch.testing.assert_close(out2[0], out1[0], rtol=0, atol=0)
    assert not torch.equal(out2[1:], out1[1:])
    _restore(pool, snap)
    prev = pool.swa_slot_of(stack.r2t[1, CTX - 2 : CTX - 1].long())  # position ctx - 2
    for i, t in enumerate(pool.swa):
        if t is not None:
            t[prev] = ds.fill_records(t[prev].clone(), None, g)
        elif i in pool.ring:
            pool.ring[i][1, (CTX - 2) % cfg.sliding_window] = 0x30
    out3 = stack.step()
    assert not torch.equal(out3[0], out1[0])
    torch.testing.assert_close(out3[1:], out1[1:], rtol=0, atol=0)


@torch.no_grad()
def test_served_stack_stores_land_in_the_mapped_slots():
    """The step writes each request's SWA record at the SWA slot its decode position maps to, in
    every SWA-pool layer, and nothing else of the SWA pool; ratio-2 sources complete the entry
    of positions ctx - 2, ctx - 1 (ctx even) at its page's row."""
    cfg = preset("tiny")
    stack = _stack(cfg, attn_dtype=None)
    pool = stack.pool
    before = _snapshot(pool)
    stack.step()
    after = dict(zip(map(id, pool.tensors()), pool.tensors(), strict=True))
    old = dict(zip(map(id, pool.tensors()), before, strict=True))
    dst = pool.swa_slot_of(stack.out_loc)
    for t in pool.swa:
        changed = (after[id(t)] != old[id(t)]).any(-1).nonzero().flatten()
        assert sorted(changed.tolist()) == sorted(dst.tolist())
    for s in pool.main:
        rows = stack.r2t[1:, CTX - 1].long() // cfg.ratio(s)
        changed = (pool.main[s] != old[id(pool.main[s])]).any(-1).nonzero().flatten()
        assert sorted(changed.tolist()) == sorted(rows.tolist()), s
