"""The head-to-head machinery on CPU: launch flags, log parsing, the table, the agreement rules.

- both sides get the same shared flags and profile environment; only the plugin switch and the
  CUDA-graph flags differ;
- each server's log gives max_total_num_tokens, bytes per token of context, the longest context
  it admits, and who served (recorded logs in tests/cpu/data/head_to_head);
- the table (markdown, ratios, skipped points) and its plot render from a result;
- the agreement verdicts pass exact agreement and fail on each rule broken.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_dsv41.plugin_switch import SWITCH_ENV
from sglang_dsv41.tools import agreement
from sglang_dsv41.tools.head_to_head import (
    PROFILES,
    Settings,
    common_flags,
    launch_spec,
    parse_log,
)

DATA = Path(__file__).parent / "data" / "head_to_head"
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))


def test_both_sides_share_every_flag_but_the_switch_and_graphs():
    s = Settings(profile="marlin")
    ours, ours_env = launch_spec("ours", "/m", 1, s)
    stock, stock_env = launch_spec("stock", "/m", 1, s)
    shared = common_flags(s)
    assert ours[:-1] == stock[:-2] and ours[:-1][-len(shared) :] == shared
    assert ours[-1:] == ["--disable-cuda-graph"]
    assert stock[-2:] == ["--cuda-graph-max-bs-decode", "64"]
    assert ours_env[SWITCH_ENV] == "on" and stock_env[SWITCH_ENV] == "off"
    for key, value in PROFILES["marlin"].env.items():
        assert ours_env[key] == stock_env[key] == value
    assert "--moe-runner-backend" in shared and "marlin" in shared
    with pytest.raises(ValueError, match="side"):
        launch_spec("both", "/m", 1, s)


def test_sglang_parses_both_launches():
    """Every flag of both launches is one SGLang 0.5.23 takes, spelled out (its own parser, no
    abbreviations: `--cuda-graph-max-bs` is ambiguous there and ended the stock launch)."""
    import argparse

    pytest.importorskip("sglang.srt.server_args")
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    for side, graphs in (("ours", None), ("stock", 64)):
        argv, _ = launch_spec(side, "/m", 1, Settings(profile="marlin"))
        ns = parser.parse_args(argv[argv.index("sglang.launch_server") + 1 :])
        assert ns.cuda_graph_max_bs_decode == graphs and ns.mem_fraction_static == 0.85


def test_stock_log():
    got = parse_log((DATA / "stock.log").read_text())
    assert got["served_by"] == "stock" and got["cuda_graphs"] is True
    assert got["max_total_num_tokens"] == 74500096 and got["context_len"] == 1048576
    assert got["stock_pool_full"] == 74500096 and got["weights_gib"] == 45.9
    assert got["kv_bytes_per_token"] == pytest.approx((93.5 - 24.1) * 2**30 / 74500096)
    assert got["longest_context"] == 1048576


def test_ours_log():
    got = parse_log((DATA / "ours.log").read_text())
    assert got["served_by"] == "ours" and got["ours_cuda_model"] is False  # the CPU model
    assert got["cuda_graphs"] is False
    assert got["max_total_num_tokens"] == 262144 and got["ours_global_bytes_per_token"] == 106.0
    assert got["ours_pool_bytes"] == 28374924 and got["stock_pool_full"] is None
    assert got["longest_context"] == min(got["context_len"], got["max_total_num_tokens"])


def test_missing_lines_give_none():
    got = parse_log("nothing here\n")
    assert got["max_total_num_tokens"] is None and got["kv_bytes_per_token"] is None
    assert got["served_by"] is None and got["longest_context"] is None


def _point(inp, conc, tpot, tput):
    return {
        "input_len": inp,
        "output_len": 64,
        "max_concurrency": conc,
        "output_throughput": tput,
        "median_ttft_ms": 10.0 * inp / 1024,
        "median_tpot_ms": tpot,
        "p99_tpot_ms": tpot * 1.5,
    }


def test_table_and_plot(tmp_path):
    import head_to_head as h2h

    stock_log = parse_log((DATA / "stock.log").read_text())
    ours_log = dict(stock_log, max_total_num_tokens=2 * stock_log["max_total_num_tokens"])
    result = {
        "profile": "marlin",
        "sides": [
            {"label": "ours", "log": ours_log, "points": [_point(1024, 1, 5.0, 190.0)],
             "skipped": [[32768, 64, 64]], "peak_gpu_mib": 120000, "ready_s": 80.0},
            {"label": "stock", "log": stock_log,
             "points": [_point(1024, 1, 6.0, 160.0), _point(32768, 64, 30.0, 900.0)],
             "skipped": [], "peak_gpu_mib": 121000, "ready_s": 95.0},
        ],
    }  # fmt: skip
    h2h.write(result, tmp_path)
    md = (tmp_path / "head_to_head.md").read_text()
    assert "| max_total_num_tokens | 149,000,192 | 74,500,096 | 0.50 |" in md
    assert "| 1024 | 64 | 1 | median_tpot_ms | 5.00 | 6.00 | 1.20 |" in md
    assert "| 32768 | 64 | 64 | median_tpot_ms | skipped | 30.00 | - |" in md
    assert (tmp_path / "head_to_head.png").stat().st_size > 10_000
    again = tmp_path / "again"
    h2h.main(["--render", str(tmp_path / "head_to_head.json"), "--out", str(again)])
    assert (again / "head_to_head.md").read_text() == md


def test_points_run_cheapest_first():
    import argparse

    import head_to_head as h2h

    args = argparse.Namespace(
        input_len=[1024, 8192, 32768], output_len=[64], concurrency=[1, 16, 64], rounds=2,
        min_prompts=4,
    )  # fmt: skip
    pts = h2h.grid(args)
    assert pts[0] == (1024, 64, 1) and pts[-1] == (32768, 64, 64) and len(pts) == 9
    assert h2h.parse_side("b=ours:--device cpu --x 1") == ("b", "ours", ["--device", "cpu",
                                                                          "--x", "1"])  # fmt: skip


def _scored(conts, deficit=0.0, flip=()):
    rows = []
    for i, c in enumerate(conts):
        top = [t + 1 if (i, k) in flip else t for k, t in enumerate(c)]
        rows.append({"top1": top, "deficit": [deficit if (i, k) in flip else 0.0
                                              for k in range(len(c))]})  # fmt: skip
    return rows


def test_agreement_rules():
    conts = [[5, 6, 7, 8]] * 10
    exact = agreement.judge("oracle", conts, _scored(conts))
    assert exact["pass"] and exact["agreement"] == 1.0 and exact["greedy_equal"] == 10
    near = agreement.judge("oracle", conts, _scored(conts, 0.1, {(0, 2)}))
    assert near["pass"] and near["divergences"][0] == {"step": 2, "deficit": 0.1}
    far = agreement.judge("oracle", conts, _scored(conts, 0.5, {(0, 2)}))
    assert not far["pass"] and far["within_tol"] < 1.0  # a disagreement beyond the tolerance
    many = {(i, k) for i in range(10) for k in (1, 3)}
    low = agreement.judge("oracle", conts, _scored(conts, 0.01, many))
    assert not low["pass"] and low["agreement"] == 0.5  # near-ties, but too many
    other = [[5, 6, 9, 9]] * 10  # the scorer's own greedy run parts at step 2
    stock = agreement.judge("stock", conts, _scored(conts), other)
    assert stock["greedy_equal"] == 0 and stock["greedy_near_tie"] == 1.0 and stock["pass"]
    assert "VERDICT ours-vs-stock: PASS" in agreement.verdict_line("stock", stock)


def test_prompts_cover_16_to_8k():
    ps = agreement.prompts(129280)
    assert len(ps) >= 20 and min(map(len, ps)) == 16 and max(map(len, ps)) == 8192
    assert all(2 <= t < 129280 for p in ps for t in p)
    assert ps == agreement.prompts(129280)  # fixed seed


def test_agreement_rides_on_the_table_servers(tmp_path, monkeypatch):
    """--agreement: stock's continuations first, then ours' and its scores of stock's, each on
    the server that then runs the points, with the op census in that server's environment."""
    import head_to_head as bench

    events = []

    class FakeServer:
        def __init__(self, side, model_path, log, settings, extra=(), env_extra=None):
            self.side, self.log, self.url, self.command = side, Path(log), f"u-{side}", side
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self.log.write_text("")
            events.append(("start", side, (env_extra or {}).get("DSV41_OP_CENSUS")))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append(("stop", self.side))

        def wait_ready(self, timeout):
            return 1.0

    def generate(url, ps, new=4):
        events.append(("generate", url))
        return [[7] * new for _ in ps]

    def score(url, ps, conts):
        events.append(("score", url, len(conts)))
        return [[{"top1": 7, "d": 0.0}] * len(c) for c in conts]

    monkeypatch.setattr(bench, "Server", FakeServer)
    monkeypatch.setattr(bench.serve_bench, "run_point", lambda *a, **k: None)
    monkeypatch.setattr(agreement, "generate", generate)
    monkeypatch.setattr(agreement, "score", score)
    monkeypatch.setattr(
        agreement, "write_prompts", lambda m, w: agreement._dump(w / "prompts.json", [[1, 2]])
    )
    (tmp_path / "agree").mkdir()
    args = ["--model-path", str(tmp_path), "--work", str(tmp_path / "w"), "--out", str(tmp_path)]
    bench.main(args + ["--agreement", str(tmp_path / "agree"), "--input-len", "16"])
    census = str(tmp_path / "agree" / "census_stock")
    assert events[:3] == [("start", "stock", census), ("generate", "u-stock"), ("stop", "stock")]
    assert events[3:] == [
        ("start", "ours", str(tmp_path / "agree" / "census_ours")),
        ("generate", "u-ours"),
        ("score", "u-ours", 1),
        ("stop", "ours"),
    ]
    assert (tmp_path / "agree" / "ours_on_stock.json").exists()
