"""The cached serving path on CUDA with the tiny checkpoint (tools.make_checkpoint), driven by a
toy scheduler through `serving.layer_loop`: Triton stores and sparse attention on SM90+; the
indexer's torch reference on the device (tiny's DI=32 / HI=2 / blocks of 4 are outside the Triton
indexer's shapes). Prompts exceed the window (16), top-k (8 entries) and candidate pool (12
blocks x 4); prefill is chunked at odd sizes (ratio-2 pending tokens), then decode; the replay
case runs decoder bounded replay (rings). SWA records sit at SWA slots through the toy's full ->
SWA mapping, as under SGLang's hybrid SWA allocator.

1. Per layer, on the same inputs: Triton vs the dispatchers' torch references on the device
   (DSV41_FORCE_REF=1): pool bytes equal after compress / write_swa, attention within bf16 error.
2. End to end against the CPU reference: greedy tokens (free running) and teacher-forced next
   tokens with the reference's logit gap at every disagreement, for the Triton path (A) and the
   same path with DSV41_FORCE_REF=1 on CUDA (B). Both agree with the CPU up to near-ties: the
   pure-torch model passes fp32 queries (the exact path). With bf16 queries (2e-3 relative per
   layer) this tiny random fp32 model agreed on only ~70-85% of teacher-forced next tokens, as
   the CPU path does with its queries rounded to bf16 (docs/gpu_serving.md); test 1 runs the
   bf16 option against the references with the same rounding.
DSV41_GPU_REPORT=path writes the numbers as JSON.
"""

from __future__ import annotations

import copy
import json
import os
import time

import pytest
import torch

# DSV41_GPU_TEST_DEVICE=cpu dry-runs the plumbing here (the dispatchers then run their refs)
DEVICE = os.environ.get("DSV41_GPU_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"
)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from sglang_dsv41.config import preset
    from sglang_dsv41.reference.model import ReferenceModel, load_reference
    from sglang_dsv41.tools.make_checkpoint import random_weights, write_checkpoint

    try:
        path = write_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)
        ref = load_reference(str(path))
    except ImportError as e:  # no tokenizers / safetensors: the same weights, in memory
        print("make_checkpoint unavailable:", e)
        ref = ReferenceModel(preset("tiny"))
        ref.load_state_dict(random_weights(ref.cfg, 0))
        ref.eval()
    return ref, copy.deepcopy(ref).to(DEVICE)


@pytest.fixture(scope="module")
def report():
    out = {}
    yield out
    dst = os.environ.get("DSV41_GPU_REPORT")
    if dst:
        with open(dst, "w") as f:
            json.dump(out, f, indent=1)


def _launch_counts(monkeypatch):
    from sglang_dsv41.kernels.kv_store import triton as ks_tri
    from sglang_dsv41.kernels.sparse_attn import triton as at_tri

    counts = {"store": 0, "attention": 0}

    def wrap(mod, name, key):
        fn = getattr(mod, name)

        def counted(*a, **k):
            counts[key] += 1
            return fn(*a, **k)

        monkeypatch.setattr(mod, name, counted)

    wrap(ks_tri, "store_records", "store")
    wrap(at_tri, "sparse_attention", "attention")
    return counts


def _compare(ref, prompts, got, new, replay):
    """Per prompt: first mismatch index (or None) and the reference's logit gap there."""
    rows = []
    for p, g in zip(prompts, got, strict=False):
        want = ref.generate(p, new, replay=replay)
        k = next((j for j, (a, b) in enumerate(zip(g, want, strict=False)) if a != b), None)
        gap = None
        if k is not None:
            F = ref.replay_floor_for(len(p), replay)
            logits = ref.forward(torch.tensor(p + want[:k]), replay_floor=F)[-1]
            gap = float(logits[want[k]] - logits[g[k]])
        rows.append({"len": len(p), "got": g, "ref": want, "mismatch": k, "gap": gap})
    return rows


@pytest.fixture(params=["chunked", "replay"])
def case(request) -> str:
    """The serving case a test runs (`_case`): chunked prefill, or decoder bounded replay."""
    return request.param


def _case(ref, case):
    """(prompts, chunk, floors, replay, rings: the pool's replay layout)."""
    from sglang_dsv41.serving.toy import prompts

    if case == "chunked":
        return prompts([1, 20, 41, 66, 131]), 9, None, False, False
    ps = prompts([10, 37, 70], seed=9)
    W = ref.cfg.sliding_window
    return ps, 7, [max(0, len(p) - W) for p in ps], True, True


class Probe:
    """Wraps serving.attention.attention_layer: each step with Triton and with the torch
    references on copies of the live pool, same inputs; then the Triton layer runs on."""

    def __init__(self, monkeypatch):
        self.mp = monkeypatch
        self.stats = {
            "compress": 0,
            "swa": 0,
            "attend": 0,
            "byte_diffs": 0,
            "bytes": 0,
            "slot_diffs": 0,
            "attn_rel_err_max": 0.0,
        }

    def _ref(self, on):
        if on:
            self.mp.setenv("DSV41_FORCE_REF", "1")
        else:
            self.mp.delenv("DSV41_FORCE_REF", raising=False)

    def _cmp(self, a, b):
        for name in ("swa", "main", "index_k", "ring", "pending"):
            bufs = getattr(a, name)
            keys = range(len(bufs)) if isinstance(bufs, list) else list(bufs)
            for k in keys:
                x, y = getattr(a, name)[k], getattr(b, name)[k]
                if x is None:
                    continue
                if name in ("ring", "pending"):  # request slot 0: the padding sink, written
                    x, y = x[1:], y[1:]  # by every row that stores nothing, in any order
                self.stats["byte_diffs"] += int((x != y).sum())
                self.stats["bytes"] += x.numel()

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        from sglang_dsv41.config import FULL
        from sglang_dsv41.serving import attention as kp
        from sglang_dsv41.serving import stores

        pa, pb = copy.deepcopy(pool), copy.deepcopy(pool)
        if attn.role == FULL:
            xa, ra = (x, rows) if x_all is None else (x_all, rows_all)
            stores.compress(attn, xa, ra, ctx, pa)
            self._ref(True)
            stores.compress(attn, xa, ra, ctx, pb)
            self._ref(False)
            self._cmp(pa, pb)
            self.stats["compress"] += 1
        if rows.n:
            q, _ = attn.query(x, rows.pos)
            swa_a = stores.write_swa(attn, x, rows, ctx, pa, floor)
            self._ref(True)
            swa_b = stores.write_swa(attn, x, rows, ctx, pb, floor)
            self._ref(False)
            self._cmp(pa, pb)
            self.stats["slot_diffs"] += int((swa_a[1] != swa_b[1]).sum())
            self.stats["swa"] += 1
        y = kp.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        if rows.n:
            oa = kp.attend(attn, q, rows, ctx, pa, swa_a)
            self._ref(True)
            ob = kp.attend(attn, q, rows, ctx, pb, swa_b)
            self._ref(False)
            oa, ob = oa.float(), ob.float()  # bf16 with the bf16 attention option
            err = float((oa - ob).norm() / ob.norm().clamp_min(1e-30))
            self.stats["attn_rel_err_max"] = max(self.stats["attn_rel_err_max"], err)
            self.stats["attend"] += 1
        return y


@torch.no_grad()
@pytest.mark.parametrize("attn_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernels_equal_references_inside_serving(models, report, monkeypatch, case, attn_dtype):
    """attn_dtype: the attention's I/O option, on the kernels and the references alike."""
    from sglang_dsv41.kernels.dispatch import Path, device_paths
    from sglang_dsv41.layers.attention import set_attention_dtype
    from sglang_dsv41.serving.toy import ToyEngine, serve

    ref, dev_model = models
    dev = torch.device(DEVICE)
    ok = Path.TRITON in device_paths(dev)
    assert ok or DEVICE != "cuda", "the kernel path needs SM90+ and Triton"
    counts = _launch_counts(monkeypatch)
    probe = Probe(monkeypatch)
    from sglang_dsv41.serving import layer_loop

    ps, chunk, floors, _, ring = _case(ref, case)
    monkeypatch.setattr(layer_loop, "attention_layer", probe)
    set_attention_dtype(dev_model, attn_dtype)
    try:
        serve(ToyEngine(dev_model, device=dev, replay=ring), ps, 4, chunk=chunk, floors=floors)
    finally:
        set_attention_dtype(dev_model, None)
    name = case if attn_dtype is None else case + "_bf16"
    report["probe_" + name] = {**probe.stats, "launches": dict(counts)}
    print(case, probe.stats, counts)
    st = probe.stats
    assert st["compress"] and st["swa"] and st["attend"]
    assert DEVICE != "cuda" or (counts["store"] and counts["attention"]), counts
    assert st["byte_diffs"] == 0 and st["slot_diffs"] == 0, st
    assert st["attn_rel_err_max"] < 1e-2, st  # bf16 queries and dots vs fp32


def _forced(model, dev, ps, chunk, floors, ring, tokens):
    """Logits fp32 [steps][B, V] of the kernel path fed the prompts, then `tokens` (teacher
    forcing, one list per prompt)."""
    from sglang_dsv41.serving.toy import ToyEngine

    eng = ToyEngine(model, device=dev, replay=ring)
    todo = {r: list(p) for r, p in enumerate(ps, start=1)}
    last = {}
    while todo:
        work = []
        for r in list(todo):
            take, todo[r] = todo[r][:chunk], todo[r][chunk:]
            work.append((r, take))
        logits = eng.step(work, [floors[r - 1] for r, _ in work] if floors else None).cpu()
        for (r, _), row in zip(work, logits, strict=False):
            if not todo[r]:
                last[r] = row
                del todo[r]
    out = [torch.stack([last[r] for r in range(1, len(ps) + 1)])]
    for k in range(len(tokens[0]) - 1):
        out.append(eng.step([(r, [t[k]]) for r, t in enumerate(tokens, start=1)], floors).cpu())
    return out


@torch.no_grad()
def test_kernel_path_against_cpu_reference(models, report, monkeypatch, case):
    from sglang_dsv41.serving.toy import ToyEngine, serve

    ref, dev_model = models
    dev = torch.device(DEVICE)
    new = 6
    ps, chunk, floors, replay, ring = _case(ref, case)
    want = [ref.generate(p, new, replay=replay) for p in ps]
    res = {}
    cpu = _forced(ref, torch.device("cpu"), ps, chunk, floors, ring, want)
    for name, force in (("triton", False), ("torch_on_cuda", True)):
        if force:
            monkeypatch.setenv("DSV41_FORCE_REF", "1")
        _sync()
        t0 = time.perf_counter()
        got = serve(
            ToyEngine(dev_model, device=dev, replay=ring),
            ps,
            new,
            chunk=chunk,
            floors=floors,
        )
        _sync()
        wall = time.perf_counter() - t0
        free = _compare(ref, ps, got, new, replay)
        gpu = _forced(dev_model, dev, ps, chunk, floors, ring, want)
        agree, flips = 0, []
        for lc, lg in zip(cpu, gpu, strict=False):
            a, b = lc.argmax(-1), lg.argmax(-1)
            agree += int((a == b).sum())
            for j in (a != b).nonzero().flatten().tolist():
                flips.append(float(lc[j, a[j]] - lc[j, b[j]]))
        n = sum(lc.shape[0] for lc in cpu)
        res[name] = {
            "free_running": [(r["len"], r["mismatch"], r["gap"]) for r in free],
            "forced_agree": f"{agree}/{n}",
            "forced_flip_gaps": flips,
            "max_abs_logit_diff": max(
                float((a - b).abs().max()) for a, b in zip(cpu, gpu, strict=False)
            ),
            "serve_s": wall,
        }
        monkeypatch.delenv("DSV41_FORCE_REF", raising=False)
    report["e2e_" + case] = res
    print(case, json.dumps(res))
    # The layer passes fp32 queries, so the attention kernel takes its exact path (fp32 tiles,
    # IEEE products). Before that path existed the kernel rounded q to bf16 and agreed on only
    # 25/30 and 12/18 teacher-forced tokens (H200, 2026-11-29, docs/gpu_serving.md). Both paths
    # must now agree with the CPU oracle except at near-ties.
    for name in ("torch_on_cuda", "triton"):
        agree, n = map(int, res[name]["forced_agree"].split("/"))
        assert agree >= 0.9 * n, (name, res[name])
        assert all(g < 0.05 for g in res[name]["forced_flip_gaps"]), (name, res[name])
