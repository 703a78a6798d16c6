"""The `dsv41` backend and pool under speculative decoding (SGLang's side, without its worker).

- a TARGET_VERIFY batch (SGLang's shapes: seq_lens are the committed lengths, out_cache_loc
  holds `width` slots per request) gets the verify context: rows at [prefix, prefix + width)
  per request, lengths after the block, the slot table; a verify wider than the pool was sized
  for, or a ragged (compact) layout, is refused by name;
- the pool sizes its rings and pending pairs for the server's verify width (read once from
  SGLang's published config) and holds exactly the bytes the geometry says;
- the request-start hook leaves a target verify alone (SGLang counts it as an extend);
- CUDA-graph capture accepts target verify as it accepts decode.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.model_executor.forward_batch_info")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_dsv41.config import preset  # noqa: E402
from sglang_dsv41.serving.context import verify_context  # noqa: E402
from sglang_dsv41.serving.geometry import PoolGeometry  # noqa: E402
from sglang_dsv41.sglang.backend import DSV41AttnBackend  # noqa: E402
from sglang_dsv41.sglang.options import ServingOptions  # noqa: E402
from sglang_dsv41.sglang.pool import DSV41KVPool  # noqa: E402

WIDTH = 6


def _pool(verify_width=WIDTH, replay=True):
    cfg = preset("tiny")
    return DSV41KVPool(
        ServingOptions(cfg, replay), 4096, 700, 2, 9, context_len=512, verify_width=verify_width
    )


def _backend(pool):
    r2t = torch.arange(10 * 512, dtype=torch.int32).view(10, 512) % 4096
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=r2t))
    runner.token_to_kv_pool = pool
    return DSV41AttnBackend(runner)


def _verify_batch(prefix, width=WIDTH, ragged=None):
    B = len(prefix)
    prefix = torch.tensor(prefix)
    pos = (prefix[:, None] + torch.arange(width)).reshape(-1)
    return SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        req_pool_indices=torch.tensor([3, 1, 7][:B]),
        seq_lens=prefix,
        seq_lens_cpu=prefix + width,  # SGLang widens the host copy for backends like this one
        out_cache_loc=torch.arange(B * width) + 100,
        positions=pos,
        spec_info=SimpleNamespace(draft_token_num=width, ragged_verify_layout=ragged),
    )


def test_verify_batch_gets_the_verify_context():
    pool = _pool()
    backend = _backend(pool)
    fb = _verify_batch([5, 40, 17])
    backend.init_forward_metadata(fb)
    ctx = fb.dsv41_context
    want = verify_context(
        fb.req_pool_indices, fb.seq_lens, WIDTH, fb.out_cache_loc, backend.req_to_token,
        pool.floor[fb.req_pool_indices], 40 + WIDTH,
    )  # fmt: skip
    assert torch.equal(ctx.rows.pos, fb.positions) and torch.equal(ctx.rows.pos, want.rows.pos)
    assert ctx.rows.req.tolist() == [b for b in range(3) for _ in range(WIDTH)]
    assert torch.equal(ctx.seq_lens, fb.seq_lens + WIDTH)
    assert ctx.table_len == 40 + WIDTH and not ctx.replaying and ctx.max_slots is None
    assert torch.equal(ctx.out_loc, fb.out_cache_loc)


def test_verify_wider_than_the_pool_or_ragged_is_refused():
    backend = _backend(_pool(verify_width=4))
    with pytest.raises(RuntimeError, match="6 rows per request, but the pool was sized for 4"):
        backend.init_forward_metadata(_verify_batch([5, 9]))
    backend = _backend(_pool())
    with pytest.raises(NotImplementedError, match="ragged layout"):
        backend.init_forward_metadata(_verify_batch([5, 9], ragged=object()))


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("width", [1, 2, WIDTH])
def test_pool_sized_for_the_verify_width(replay, width):
    pool = _pool(width, replay)
    g = PoolGeometry(preset("tiny"), replay, width)
    assert pool.nbytes() == g.buffer_bytes(4096, 700, 2, 9)
    W = preset("tiny").sliding_window
    assert all(r.shape[1] == W + width - 1 for r in pool.ring.values())
    assert len(pool.ring) == (len(g.ring_layers) if replay else 0)
    assert all(p.shape[1] == width // 2 + 1 for p in pool.pending.values())


def test_served_verify_width_reads_the_server(monkeypatch):
    import sglang.srt.runtime_context as rc

    from sglang_dsv41.sglang.speculative import served_verify_width

    spec = SimpleNamespace(speculative_algorithm="DSPARK", speculative_num_draft_tokens=WIDTH)
    monkeypatch.setattr(rc, "get_spec", lambda: spec)
    assert served_verify_width() == WIDTH
    spec.speculative_algorithm = None
    assert served_verify_width() == 1


def test_request_start_hook_skips_target_verify(monkeypatch):
    from sglang_dsv41.sglang import hooks

    monkeypatch.setattr(hooks, "served", lambda: ServingOptions(preset("tiny"), True))
    started = []
    pool = SimpleNamespace(start_request=lambda *a: started.append(a), engram_tail=None)
    runner = SimpleNamespace(token_to_kv_pool=pool)
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY)
    assert hooks._init_new("result", None, batch, runner) == "result"
    assert started == []


def test_graph_capture_accepts_target_verify():
    backend = _backend(_pool())
    backend.init_forward_metadata_out_graph(_verify_batch([5]))
    with pytest.raises(NotImplementedError, match="prefill runs eager"):
        backend.init_forward_metadata_out_graph(SimpleNamespace(forward_mode=ForwardMode.EXTEND))
