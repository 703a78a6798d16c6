"""kv_report --plot / --json on the tiny model: the capacity numbers come from the one byte
calculator, every row is the floor of budget / bytes, and the PNG is written; on the flash
preset the figures are V4.1-Flash's (890 vs 1630 B/token, the released weights)."""

import json
import math
import struct

import pytest

from sglang_dsv41.config import preset
from sglang_dsv41.tools import kv_capacity, kv_report
from sglang_dsv41.tools.kv_capacity import GiB, pool_geometry
from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert make_checkpoint(["--preset", "tiny", "--out", str(out), "--force"]) == 0
    return out


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def _check_rows(cap, reserve_gib):
    assert cap["contexts"][0] == 8192 and cap["contexts"][-1] == 2**20
    n = len(cap["contexts"])
    assert len(cap["rows"]) == len(cap["gpu_bytes"]) * 2 * 2 * n
    fps = {f["layout"]: f for f in cap["footprints"]}
    for r in cap["rows"]:
        fp = fps[r["layout"]]
        assert r["bytes_per_request"] == fp["per_token"] * r["context"] + fp["per_request"]
        budget = cap["gpu_bytes"][r["gpu"]] - reserve_gib * GiB - r["weights_gib_per_gpu"] * GiB
        assert math.isclose(r["kv_budget_gib_per_gpu"] * GiB, budget, rel_tol=1e-9)
        k = r["requests_per_gpu"]
        assert k * r["bytes_per_request"] <= budget < (k + 1) * r["bytes_per_request"]
        assert r["requests_per_node"] == k * (8 if r["deployment"] == "DP8" else 1)
    for gpu in cap["gpu_bytes"]:
        for dep in ("TP8", "DP8"):
            for lay in fps:
                seq = [
                    r["requests_per_gpu"]
                    for r in cap["rows"]
                    if (r["gpu"], r["deployment"], r["layout"]) == (gpu, dep, lay)
                ]
                assert seq == sorted(seq, reverse=True) and len(seq) == n


def test_plot_and_json_on_tiny(tiny, tmp_path, capsys):
    png = tmp_path / "kv.png"
    assert kv_report.main(["--model", str(tiny), "--json", "--plot", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    w, h = _png_size(png)
    assert w >= 1200 and h >= 400 and png.stat().st_size > 20_000
    cfg = preset("tiny")
    g = pool_geometry(cfg)
    cap = rep["capacity"]
    fps = {f["layout"]: f for f in cap["footprints"]}
    assert fps["dsv41"]["per_token"] == g.global_bytes_per_token() == rep["global_bytes_per_token"]
    assert fps["dsv41"]["per_request"] == g.swa_bytes_per_window() + g.pending_bytes_per_request()
    assert fps["v4"]["per_token"] == rep["v4_global_bytes_per_token"]
    assert fps["v4"]["per_request"] == rep["v4_swa_bytes_per_request"]
    _check_rows(cap, kv_capacity.DEFAULT_RESERVE_GIB)
    # without --json the text report is unchanged and the plot is still written
    png2 = tmp_path / "kv2.png"
    assert kv_report.main(["--model", str(tiny), "--plot", str(png2), "--reserve-gib", "20"]) == 0
    text = capsys.readouterr().out
    assert "global state:" in text and "GiB per GPU at TP8" in text and png2.exists()


def test_flash_capacity_figures(capsys):
    assert kv_report.main(["--preset", "flash", "--json", "--reserve-gib", "12"]) == 0
    cap = json.loads(capsys.readouterr().out)["capacity"]
    fps = {f["layout"]: f for f in cap["footprints"]}
    assert fps["dsv41"]["per_token"] == 890.0 and fps["v4"]["per_token"] == 1630.0
    assert fps["dsv41"]["per_request"] == 528 * 128 * 40 + 3 * 2 * 512 * 4
    assert fps["v4"]["per_request"] == 584 * 128 * 40
    # the released text weights, Engram tables included (~475 GiB with MTP and vision)
    assert 440 < cap["weights_gib"]["total"] < 480
    _check_rows(cap, 12.0)
    by = {(r["gpu"], r["deployment"], r["layout"], r["context"]): r for r in cap["rows"]}
    tp, dp = by[("8xH200", "TP8", "dsv41", 2**20)], by[("8xH200", "DP8", "dsv41", 2**20)]
    w = cap["weights_gib"]
    # TP8: the ~1 GiB SGLang keeps whole on every rank (wq_a, wkv, compressors, indexers, norms,
    # mHC, router, Engram's wkv), an eighth of the rest; DP8 adds the attention, embed and head
    assert 0.9 < w["replicated_TP8"] < 1.1 and w["replicated_TP8"] < w["replicated_DP8"]
    tp_gib = (w["total"] - w["replicated_TP8"]) / 8 + w["replicated_TP8"]
    assert math.isclose(tp["weights_gib_per_gpu"], tp_gib)
    assert dp["weights_gib_per_gpu"] > tp["weights_gib_per_gpu"]
    for key in by:
        if key[2] == "dsv41":
            v4 = by[(key[0], key[1], "v4", key[3])]
            assert by[key]["requests_per_gpu"] >= v4["requests_per_gpu"]


@pytest.mark.parametrize(
    ("name", "tp8", "dp8"),
    [
        ("layers.3.attn.wq_a.weight", True, True),
        ("layers.3.attn.wkv.scale", True, True),
        ("layers.3.attn.compressor.wkv.weight", True, True),
        ("layers.3.attn.indexer.wq_b.weight", True, True),
        ("layers.3.engram.wkv.weight", True, True),
        ("layers.3.ffn.gate.weight", True, True),
        ("layers.3.hc_attn_fn", True, True),
        ("norm.weight", True, True),
        ("layers.3.attn.wq_b.weight", False, True),
        ("layers.3.attn.wo_b.weight", False, True),
        ("layers.3.attn.attn_sink", False, True),
        ("embed.weight", False, True),
        ("layers.3.engram.embed.weight", False, False),
        ("layers.3.ffn.experts.7.w1.weight", False, False),
        ("layers.3.ffn.shared_experts.w2.weight", False, False),
    ],
)
def test_replicated_tensors(name, tp8, dp8):
    assert kv_capacity.replicated_under("TP8", name) is tp8
    assert kv_capacity.replicated_under("DP8", name) is dp8
