"""The agreement harness (`tools.agreement`) against a live server, on CPU: our server serves a
flash-slice at flash-mini widths in fp32 (the pure-torch model, which equals the oracle), so its
greedy continuations, its own teacher-forced view of them and the packed-expert oracle's view
(`tools.packed_oracle`, fp32, no served-numerics switches: this model has none) must all agree:
the harness's request shapes, the alignment of input log-probabilities with the continuation and
the oracle's replay floor are what this checks."""

from __future__ import annotations

import pytest
from e2e.server import Server

from sglang_dsv41.tools import agreement
from sglang_dsv41.tools.packed_oracle import score_continuations

LENS = (5, 20, 47, 90)


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory):
    from sglang_dsv41.tools.slice_weights import write_flash_slice
    from sglang_dsv41.weights.release_config import flash_mini_text_config, flash_text_config

    full, mini = flash_text_config(), flash_mini_text_config()
    widths = {
        k: v
        for k, v in mini.items()
        if full.get(k) != v and not k.startswith("engram_") and k != "num_hidden_layers"
    }
    out = tmp_path_factory.mktemp("ckpt") / "slice-mini"
    return write_flash_slice(out, engram_vocab=61, widths=widths, progress=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory, slice_dir):
    log = tmp_path_factory.mktemp("logs") / "agreement.log"
    s = Server(slice_dir, str(log), ("--dtype", "float32"))
    yield s
    s.stop()


def test_server_and_oracle_agree_through_the_harness(server, slice_dir):
    import random

    rng = random.Random(7)
    ps = [[rng.randrange(2, 512) for _ in range(n)] for n in LENS]
    gen = agreement.generate(server.url, ps, new=8)
    assert all(len(g) == 8 for g in gen)
    own = agreement.score(server.url, ps, gen)
    self_view = agreement.judge("stock", gen, own, gen)
    assert self_view["agreement"] >= 0.95 and self_view["within_tol"] == 1.0, self_view
    oracle = score_continuations(str(slice_dir), ps, gen, "cpu", served_numerics=False)
    fig = agreement.judge("oracle", gen, oracle)
    assert fig["pass"] and fig["agreement"] == 1.0, fig
    assert fig["deficit_max"] < 1e-3
