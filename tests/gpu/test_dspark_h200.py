"""DSpark speculative decoding through `launch_server` on one GPU (docs/speculative.md 6).

Not yet run: written while no GPU was available. The checkpoint is the flash-slice written with
its DSpark head (`python -m sglang_dsv41.tools.flash_slice --out DIR --dspark`), named by
`DSV41_FLASH_SLICE_DSPARK`; skipped without it or without CUDA.

Per side (`DSV41_DSPARK_SIDES`, default `ours`; `ours,stock` adds stock SGLang's own V4.1 on the
same checkpoint), two servers with the head-to-head flags (`tools/head_to_head.py`, profile
`PROFILE`, default marlin) and page size 256 (SGLang's V4 draft pool requires it), one plain
and one with `--speculative-algorithm DSPARK` (the draft: SGLang's `DeepseekV4ForCausalLMDSpark`
from the bundled head, its `dsv4` backend and V4 pool, FP8 records as stock SGLang keeps them:
`--speculative-draft-kv-cache-dtype fp8_e4m3`), serve the same 10 prompts of random token ids
one at a time, greedy, 48 new tokens each, streamed. Checked: speculative greedy tokens equal
plain greedy tokens on every prompt; the speculative server's log names SGLang's DSpark draft
and its `dsv4` backend. Reported (`DSV41_DSPARK_OUT/dspark_<side>.json`, printed): SGLang's
per-request acceptance length (tokens per verify, the bonus token included: 1.0 = no draft
accepted) and acceptance rate, and TPOT at concurrency 1 (time from the first streamed chunk
to the last over the tokens after the first), plain and speculative. The head's weights are
random, so acceptance is near 1 token per verify and the speculative TPOT is the cost of a
draft forward plus a 6-row verify per token; only a trained head gives a meaningful speedup.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        not os.environ.get("DSV41_FLASH_SLICE_DSPARK"), reason="DSV41_FLASH_SLICE_DSPARK unset"
    ),
]

PROMPT_LENS = (16, 33, 64, 100, 128, 250, 512, 700, 1024, 2048)
NEW_TOKENS = 48
PAGE = ["--page-size", "256"]
DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-kv-cache-dtype", "fp8_e4m3"]
DRAFT_LOGS = ("DeepseekV4ForCausalLMDSpark", "attention_backend=dsv4")


def stream_generate(url: str, ids: list, n: int) -> dict:
    """One greedy request, streamed -> output ids, meta_info of the last chunk, the times of the
    first and the last chunk (s)."""
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }
    req = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0, first, last, chunk = time.perf_counter(), None, None, None
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:") :])
            last = time.perf_counter() - t0
            first = last if first is None else first
    if chunk is None:
        raise RuntimeError(f"{url}: no streamed chunk")
    return {"ids": chunk["output_ids"], "meta": chunk["meta_info"], "first": first, "last": last}


def tpot_ms(runs: list) -> float:
    """Mean time per output token after the first, over requests (ms)."""
    return 1e3 * sum((r["last"] - r["first"]) / (len(r["ids"]) - 1) for r in runs) / len(runs)


def serve(side: str, model: str, log: Path, extra: list, prompts: list) -> tuple:
    """(streamed runs, server log) of one server serving `prompts` one at a time."""
    from sglang_dsv41.tools.head_to_head import Server, Settings

    settings = Settings(profile=os.environ.get("PROFILE", "marlin"))
    server = Server(side, model, log, settings, extra=[*PAGE, *extra])
    try:
        server.wait_ready(1200)
        stream_generate(server.url, prompts[0][:8], 2)  # warm-up: JIT kernels, graphs
        runs = [stream_generate(server.url, p, NEW_TOKENS) for p in prompts]
    finally:
        server.stop()
    return runs, log.read_text(errors="replace")


def sides() -> list:
    return [s.strip() for s in os.environ.get("DSV41_DSPARK_SIDES", "ours").split(",") if s]


@pytest.mark.parametrize("side", sides())
def test_speculative_greedy_equals_plain(side, tmp_path):
    model = os.environ["DSV41_FLASH_SLICE_DSPARK"]
    cfg = json.load(open(os.path.join(model, "config.json")))
    text = cfg.get("text_config", cfg)
    assert text.get("dspark_target_layer_ids"), f"{model}: no DSpark head (flash_slice --dspark)"
    g = torch.Generator().manual_seed(34)
    vocab = text["vocab_size"]
    prompts = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]
    plain, _ = serve(side, model, tmp_path / f"{side}_plain.log", [], prompts)
    spec, log = serve(side, model, tmp_path / f"{side}_dspark.log", DSPARK, prompts)
    out_dir = Path(os.environ.get("DSV41_DSPARK_OUT", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (f"{side}_plain.log", f"{side}_dspark.log"):
        (out_dir / name).write_text((tmp_path / name).read_text(errors="replace"))
    mismatch = [
        {"prompt_len": n, "plain": p["ids"], "dspark": s["ids"]}
        for n, p, s in zip(PROMPT_LENS, plain, spec, strict=True)
        if p["ids"] != s["ids"]
    ]
    lengths = [r["meta"].get("spec_accept_length") for r in spec]
    result = {
        "side": side,
        "prompts": len(prompts),
        "new_tokens": NEW_TOKENS,
        "equal": not mismatch,
        "mismatch": mismatch,
        "accept_length": lengths,
        "accept_length_mean": sum(x for x in lengths if x) / max(1, sum(1 for x in lengths if x)),
        "accept_rate": [r["meta"].get("spec_accept_rate") for r in spec],
        "tpot_ms_plain": tpot_ms(plain),
        "tpot_ms_dspark": tpot_ms(spec),
    }
    (out_dir / f"dspark_{side}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    for needle in DRAFT_LOGS:
        assert needle in log, f"{side} DSpark server log lacks {needle!r}"
    assert all(len(r["ids"]) == NEW_TOKENS for r in plain + spec)
    assert all(x is not None and x >= 1.0 for x in lengths), lengths
    assert not mismatch, mismatch
