"""Tensor-parallel attention over 2 GPUs with plain torch.distributed (NCCL) and our kernels.

Two processes (one per GPU) run the same toy scheduler over the same seeded model: 64 query heads
x 512, indexer 32 heads x 128 with candidate blocks of 8 (the Triton indexer's shapes), tiny's
12-layer role layout. At every attention call of a chunked prefill and decode (with and without
decoder bounded replay), each rank computes, on copies of the same state:
  - the single-GPU layer: 64 heads (`serving.attention.attention_layer`);
  - its tensor-parallel share: `serving.attention_view.local_heads(attn, 2, rank)` (32 heads,
    their sinks, wq_b rows, wo_a groups, wo_b columns), the partial output all-reduced.
Checked: the all-reduced output equals the 64-head output within the kernels' bf16 query
rounding (2e-2 of the largest magnitude; both sides run the same kernels on the same records),
the SWA / main-KV / index-K records both write are identical, and every rank selects top-k
identical to the other rank's and to the single-GPU layer's (the indexer is replicated and
reads identical inputs). Only core modules are imported (the GPU machine has no SGLang).

    python -m pytest -q tests/gpu/test_tp_attention.py      (2 GPUs, e.g. nvidia-h200-x2)
DSV41_GPU_REPORT=path writes each rank's counts and largest differences as JSON;
DSV41_GPU_TEST_DEVICE=cpu DSV41_TP_PROMPT_LENS=20,41 dry-runs it on CPU (gloo).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TP = 2
RTOL_OF_MAX = 2e-2
# DSV41_GPU_TEST_DEVICE=cpu dry-runs the plumbing on gloo (the dispatchers run their references)
DEVICE = os.environ.get("DSV41_GPU_TEST_DEVICE", "cuda")
# prompt lengths: beyond the window (32), top-k (16 entries) and candidate pool (8 x 8 positions)
PROMPT_LENS = [int(n) for n in os.environ.get("DSV41_TP_PROMPT_LENS", "90,161").split(",")]

pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < TP),
    reason=f"needs {TP} CUDA devices",
)


def _config():
    from sglang_dsv41.config import preset

    cfg = preset("tiny")
    for k, v in dict(
        hidden_size=512,
        num_attention_heads=64,
        head_dim=512,
        qk_rope_head_dim=64,
        q_lora_rank=256,
        o_lora_rank=128,
        o_groups=8,
        sliding_window=32,
        index_n_heads=32,
        index_head_dim=128,
        index_topk=16,
        candidate_block_size=8,
        candidate_topk_blocks=8,
    ).items():
        setattr(cfg, k, v)
    cfg.validate()
    return cfg


def _model(device):
    from sglang_dsv41.reference.model import ReferenceModel

    torch.manual_seed(0)
    m = ReferenceModel(_config()).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("attn_sink"):
                p.normal_(0, 0.5)
    return m.to(device)


class TPProbe:
    def __init__(self, rank: int, group):
        self.rank, self.group = rank, group
        self.stats = dict(calls=0, topk_checks=0, max_rel_diff=0.0)

    def _run(self, attn, args):
        from sglang_dsv41.serving import attention as kp

        x, rows, ctx, pool, floor, x_all, rows_all = args
        # ForwardShared: the top-k dict copied, its tensors never written in place
        pool, shared = (
            copy.deepcopy(pool),
            dataclasses.replace(ctx.shared, topk=dict(ctx.shared.topk)),
        )
        y = kp.attention_layer(attn, x, rows, ctx, pool, floor, x_all, rows_all)
        topk = {k: v.clone() for k, v in ctx.shared.topk.items()}
        ctx.shared = shared
        return y, pool, topk

    def _all_reduce(self, y):
        torch.distributed.all_reduce(y, group=self.group)
        return y

    def __call__(self, attn, x, rows, ctx, pool, floor, x_all=None, rows_all=None):
        from sglang_dsv41.serving import attention as kp
        from sglang_dsv41.serving.attention_view import local_heads
        from sglang_dsv41.testing import assert_pools_equal

        args = (x, rows, ctx, pool, floor, x_all, rows_all)
        i = attn.layer_id
        want, p_full, k_full = self._run(attn, args)
        local = local_heads(attn, TP, self.rank, reduce=self._all_reduce)
        got, p_tp, k_tp = self._run(local, args)
        if rows.n:
            scale = float(want.abs().max())
            diff = float((got.float() - want.float()).abs().max())
            self.stats["max_rel_diff"] = max(self.stats["max_rel_diff"], diff / scale)
            assert diff <= RTOL_OF_MAX * scale, (i, diff, scale)
        assert_pools_equal(p_full, p_tp, i)
        assert k_tp.keys() == k_full.keys(), i
        for k in k_tp:
            assert torch.equal(k_tp[k], k_full[k]), (i, k)
            others = [torch.empty_like(k_tp[k]) for _ in range(TP)]
            torch.distributed.all_gather(others, k_tp[k], group=self.group)
            assert all(torch.equal(o, k_tp[k]) for o in others), (i, k, "ranks differ")
            self.stats["topk_checks"] += 1
        self.stats["calls"] += 1
        return kp.attention_layer(attn, *args)


def worker(rank: int, port: int, out: str) -> None:
    from sglang_dsv41.serving import layer_loop
    from sglang_dsv41.serving.toy import ToyEngine, prompts, serve

    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        "nccl" if DEVICE == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=TP,
        rank=rank,
    )
    device = f"cuda:{rank}" if DEVICE == "cuda" else "cpu"
    model = _model(device)
    probe = TPProbe(rank, torch.distributed.group.WORLD)
    layer_loop.attention_layer = probe  # this worker process serves through the probe
    ps = prompts(PROMPT_LENS, seed=11)
    W = model.cfg.sliding_window
    with torch.no_grad():
        serve(ToyEngine(model, device=device), ps, 3, chunk=37)
        eng = ToyEngine(model, device=device, replay=True, seed=1)
        serve(eng, ps, 3, chunk=37, floors=[max(0, len(p) - W) for p in ps])
    Path(out).write_text(json.dumps(probe.stats))
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_of_32_heads_equal_64_heads(tmp_path):
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--port", str(port)]
            + ["--out", str(tmp_path / f"rank{r}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(TP)
    ]
    logs = [p.communicate(timeout=1800)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{logs[r][-4000:]}"
    stats = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(TP)]
    n_layers = _config().num_hidden_layers
    for s in stats:
        assert s["calls"] >= 8 * n_layers and s["topk_checks"] > 0, s
    print("per rank:", stats)
    dst = os.environ.get("DSV41_GPU_REPORT")
    if dst:
        Path(dst).write_text(json.dumps(stats, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    worker(a.rank, a.port, a.out)
