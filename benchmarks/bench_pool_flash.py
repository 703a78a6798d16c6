"""The served pool for the V4.1-Flash geometry, sized and built by the server's own code.

    python benchmarks/bench_pool_flash.py [--budget-gib 100] [--requests 256] [--context-len N]

Runs the plugin's pool configurator (`sglang/pool_sizing.py`) on a KV budget and builds the
`DSV41KVPool` it sizes on the meta device (no memory is touched), so the log lines are the ones
a server prints at start. Prints, for replay on and off: tokens of context the budget holds,
bytes per token of context (everything allocated / full slots), and the same for the previous
layout, which kept a 528 B SWA record per token slot for every layer whose SWA lived in token
slots (the encoder's 20 with replay on, all 40 off) next to the 890 B of global state.
Needs SGLang (the configurator reads its schedule settings); CPU only.
"""

from __future__ import annotations

import argparse
import logging

from sglang_dsv41.config import preset
from sglang_dsv41.serving.geometry import PoolGeometry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budget-gib", type=float, default=100.0)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--context-len", type=int, default=1 << 20)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from sglang.srt.server_args import ServerArgs  # noqa: F401  (SGLang present)

    from sglang_dsv41.sglang import pool_sizing
    from sglang_dsv41.sglang.options import ServingOptions
    from sglang_dsv41.sglang.pool import DSV41KVPool

    cfg = preset("flash")
    budget = int(a.budget_gib * 2**30)
    print(
        "| replay | tokens of context | B / token of context | previous layout tokens | "
        "previous B / token |"
    )
    print("|---|---|---|---|---|")
    for replay in (True, False):
        conf = object.__new__(pool_sizing.DSV41PoolConfigurator)
        conf.geometry, conf.window = PoolGeometry(cfg, replay), cfg.sliding_window
        conf.context_len, conf.user_requests, conf.user_tokens = a.context_len, None, None
        conf.chunk, conf.chunks_in_flight, conf.interval = a.chunk, 2, 128
        conf.cap, conf.budget, conf.page = None, budget, a.page
        conf.swa_ratio = None  # --swa-full-tokens-ratio unset: the SWA room from the requests
        sizes = conf._config(budget, a.page, a.requests)
        full, swa = sizes.full_max_total_num_tokens, sizes.swa_max_total_num_tokens
        pool = DSV41KVPool(
            ServingOptions(cfg, replay), full, swa, a.page, a.requests, a.context_len, device="meta"
        )
        g = pool.geometry
        total = g.total_bytes(full, swa, a.page, a.requests, a.context_len)
        assert pool.nbytes() == g.buffer_bytes(full, swa, a.page, a.requests)
        slot_swa = 528 * (cfg.decoder_start if replay else cfg.num_hidden_layers)
        old_per_slot = g.global_bytes_per_token() + slot_swa
        old_fixed = (a.requests + 1) * (g.state_bytes_per_request() + 4 * a.context_len)
        old_tokens = int((budget - old_fixed) // old_per_slot)
        print(
            f"| {'on' if replay else 'off'} | {full} | {total / full:.1f} | {old_tokens} | "
            f"{budget / old_tokens:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
