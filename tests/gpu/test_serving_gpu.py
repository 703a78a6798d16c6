"""The kernel serving path on CUDA: the tiny checkpoint (tools.make_checkpoint) served by a toy
scheduler through `serving.layer_loop` (Triton stores and sparse attention on SM90+; the
indexer's torch reference on the device, since tiny's DI=32 / HI=2 / blocks of 4 are outside
the Triton indexer's shapes), against the CPU reference's greedy tokens.

Prompts exceed the window (16), top-k (8 entries) and candidate pool (12 blocks x 4 entries);
prefill is chunked at an odd size (ratio-2 pending tokens) and followed by decode; the second
case runs decoder bounded replay (rings). A token that differs from the reference must be a
near-tie of the reference's logits (attention reads bf16 queries on the GPU): the margin is
printed and bounded. DSV41_GPU_REPORT=path writes the numbers as JSON.
"""
from __future__ import annotations

import copy
import json
import os
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NEAR_TIE = 0.05  # reference logit gap below which a greedy flip counts as a near-tie


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
    return ref, copy.deepcopy(ref).cuda()


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
    for p, g in zip(prompts, got):
        want = ref.generate(p, new, replay=replay)
        k = next((j for j, (a, b) in enumerate(zip(g, want)) if a != b), None)
        gap = None
        if k is not None:
            F = ref.replay_floor_for(len(p), replay)
            logits = ref.forward(torch.tensor(p + want[:k]), replay_floor=F)[-1]
            gap = float(logits[want[k]] - logits[g[k]])
        rows.append({"len": len(p), "got": g, "ref": want, "mismatch": k, "gap": gap})
    return rows


@torch.no_grad()
@pytest.mark.parametrize("case", ["chunked", "replay"])
def test_kernel_path_greedy_equals_reference(models, report, monkeypatch, case):
    from sglang_dsv41.kernels.dispatch import use_triton
    from sglang_dsv41.serving import layer_loop
    from sglang_dsv41.serving.toy import ToyEngine, prompts, serve

    ref, dev_model = models
    dev = torch.device("cuda")
    counts = _launch_counts(monkeypatch)
    new = 6
    if case == "chunked":
        ps = prompts([1, 20, 41, 66, 131])
        eng = ToyEngine(dev_model, layer_loop.run_layers, device=dev)
        floors, replay, chunk = None, False, 9
    else:
        ps = prompts([10, 37, 70], seed=9)
        W = ref.cfg.sliding_window
        eng = ToyEngine(dev_model, layer_loop.run_layers, device=dev, decoder_ring=True)
        floors, replay, chunk = [max(0, len(p) - W) for p in ps], True, 7
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = serve(eng, ps, new, chunk=chunk, floors=floors)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    rows = _compare(ref, ps, got, new, replay)
    report[case] = {"rows": rows, "launches": dict(counts), "serve_s": wall,
                    "triton": use_triton(dev), "gpu": torch.cuda.get_device_name()}
    print(case, json.dumps(report[case]))
    if use_triton(dev):
        assert counts["store"] > 0 and counts["attention"] > 0, counts
    for r in rows:
        assert r["mismatch"] is None or abs(r["gap"]) < NEAR_TIE, r
