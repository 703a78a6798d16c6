"""Decode through captured CUDA graphs equals eager decode bit for bit (H200).

Two toy engines with the same page shuffles serve the same traffic: requests join (chunked
prefill, eager) and leave, and every decode step runs eagerly on one engine and as a graph replay
on the other, padded to the captured sizes 1, 2, 4, 8. Logits must be equal bit for bit at every
step, and the decode path (context build, layer loop, head) must not synchronize with the host:
the eager decode forward runs under torch.cuda.set_sync_debug_mode("error").
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SIZES = (1, 2, 4, 8)


def _model():
    from sglang_dsv41.serving.toy import toy_model

    return toy_model().cuda()


@torch.no_grad()
@pytest.mark.parametrize("attn_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("replay", [False, True])
def test_graph_decode_equals_eager_bitwise(replay, attn_dtype):
    """attn_dtype: the attention's I/O option (bf16: the kernels' bf16 path)."""
    from sglang_dsv41.layers.attention import set_attention_dtype
    from sglang_dsv41.serving.toy import ToyEngine, prompts
    from sglang_dsv41.serving.toy_graphs import GraphDecoder

    m = _model()
    set_attention_dtype(m, attn_dtype)
    W = m.cfg.sliding_window
    eager = ToyEngine(m, device="cuda", replay=replay, max_requests=8, seed=1)
    graph = ToyEngine(m, device="cuda", replay=replay, max_requests=8, seed=1)
    dec = GraphDecoder(graph, SIZES)
    pool = prompts([5, 19, 40, 3, 66, 27, 90, 12, 33, 8, 50, 21, 7, 44], seed=13)
    live, nxt, steps, sizes_seen = {}, {}, 0, set()
    for step in range(60):
        if pool and (len(live) < 7 and step % 3 == 0 or not live):  # a request joins
            slot = next(s for s in range(1, 9) if s not in live)
            p = pool.pop(0)
            fl = [max(0, len(p) - W)] if replay else None
            for a in range(0, len(p), 9):  # chunked prefill, eager on both
                work = [(slot, p[a : a + 9])]
                la, lb = eager.step(work, fl), graph.step(work, fl)
            assert torch.equal(la, lb)
            live[slot] = 0
            nxt[slot] = int(la[-1].argmax())
        if not live:
            break
        work = [(s, [nxt[s]]) for s in sorted(live)]
        batch = eager.prepare(work)  # host bookkeeping and input tensors (SGLang's part)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            la = eager.forward(*batch)  # the decode path itself: no host sync
        finally:
            torch.cuda.set_sync_debug_mode("default")
        lb = dec.step(work)
        assert torch.equal(la, lb), (step, len(work))
        sizes_seen.add(len(work))
        steps += 1
        for (s, _), row in zip(work, la, strict=True):
            nxt[s] = int(row.argmax())
            live[s] += 1
        for s in [s for s, n in live.items() if n >= 12 + s]:  # a request leaves
            del live[s]
            eager.release(s)
            graph.release(s)
    assert steps >= 50 and len(sizes_seen) >= 5, (steps, sizes_seen)
