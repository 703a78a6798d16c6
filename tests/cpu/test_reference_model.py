"""The whole oracle: determinism, bounded replay semantics, generation, CLI."""

import json
import subprocess
import sys

import pytest
import torch

from sglang_dsv41.reference import ReferenceModel, load_reference
from sglang_dsv41.tools.make_checkpoint import main as make_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    make_checkpoint(["--preset", "tiny", "--out", str(out / "ckpt")])
    return out / "ckpt"


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_reference(tiny_dir)


def _ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(30, 512, (n,), generator=g)


def test_deterministic(model, tiny_dir):
    ids = _ids(200, 1)
    a, b = model(ids), model(ids)
    assert torch.equal(a, b)
    again = load_reference(tiny_dir)
    assert torch.equal(again(ids), a)


def test_replay_changes_only_the_decoder_tail(model):
    cfg = model.cfg
    L = 150
    ids = _ids(L, 2)
    F = L - cfg.sliding_window
    full, replay = {}, {}
    lf = model(ids, capture=full)
    lr = model(ids, replay_floor=F, capture=replay)
    for i in range(cfg.decoder_start):
        assert torch.equal(full[i][1], replay[i][1]), f"encoder layer {i} differs"
    assert torch.isnan(lr[:F]).all() and not torch.isnan(lr[F:]).any()
    # The first tail query's decoder SWA sees only itself under replay: the states differ.
    last = cfg.num_hidden_layers - 1
    assert replay[last][1].shape[0] == L - F
    assert not torch.allclose(full[last][1][F:], replay[last][1])
    assert not torch.allclose(lf[F:], lr[F:])


def test_replay_floor_zero_and_short_prompts_equal_full(model):
    ids = _ids(10, 3)  # shorter than the window: the floor is 0
    assert model.replay_floor_for(10, True) == 0
    assert model.generate(ids.tolist(), 4, replay=True) == model.generate(
        ids.tolist(), 4, replay=False
    )


def test_prompt_longer_than_window_topk_and_pool(model):
    cfg = model.cfg
    L = 300
    assert L // 2 > cfg.index_topk and L > cfg.candidate_topk_blocks * cfg.candidate_block_size
    out = model.generate(_ids(L, 4).tolist(), 12, replay=False)
    assert len(out) == 12 and len(set(out)) > 3


def test_generation_uses_a_fixed_replay_floor(model):
    """Decode steps after a replayed prefill continue on the same approximate states."""
    cfg = model.cfg
    prompt = _ids(80, 5).tolist()
    out = model.generate(prompt, 3, replay=True)
    F = len(prompt) - cfg.sliding_window
    seq = torch.tensor(prompt + out[:2])
    logits = model(seq, replay_floor=F)
    assert int(torch.argmax(logits[-1])) == out[2]


def test_fp8_main_kv_selectable(tiny_dir):
    m = load_reference(tiny_dir)
    m8 = load_reference(tiny_dir)
    m8.cfg.kv_cache_dtype_main = "fp8"
    ids = _ids(120, 6)
    a, b = m(ids), m8(ids)
    assert not torch.equal(a, b) and torch.isfinite(b).all()
    from sglang_dsv41.layers.quant import quant_main_kv

    x = torch.randn(64, m.cfg.head_dim)
    err4 = (quant_main_kv(m.cfg, x) - x).norm()
    err8 = (quant_main_kv(m8.cfg, x) - x).norm()
    assert err8 < err4 / 3  # V41 (e4m3) is a much finer record than V41_FP4


def _cli(tiny_dir, input_ids: str, *extra) -> subprocess.CompletedProcess:
    """`python -m sglang_dsv41.reference --model tiny_dir --input-ids ... --max-new-tokens 3`."""
    cmd = [sys.executable, "-m", "sglang_dsv41.reference", "--model", str(tiny_dir)]
    cmd += ["--input-ids", input_ids, "--max-new-tokens", "3", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_cli_prints_json(tiny_dir):
    r = _cli(tiny_dir, "5,6,7,8,9", "--no-replay")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["output_ids"]) == 3 and out["text"] is not None
    # the tokenizer loads without transformers parsing config.json (a `deepseek_v41` warning)
    assert "model of type" not in r.stderr, r.stderr
    model = load_reference(tiny_dir)
    assert out["output_ids"] == model.generate([5, 6, 7, 8, 9], 3, replay=False)


def test_cli_rejects_bad_input(tiny_dir):
    r = _cli(tiny_dir, "5,x")
    assert r.returncode == 2 and "integers" in r.stderr


def test_meta_construction_matches_eager(tiny_dir):
    assert isinstance(load_reference(tiny_dir), ReferenceModel)


def test_replay_refused_where_the_config_forbids_it():
    """A kv source after the first decoder layer: the full forward runs, replay is refused with
    the config's reason (`DeepseekV41Config.replay_error`)."""
    from sglang_dsv41.config import ConfigError, DeepseekV41Config
    from sglang_dsv41.presets import tiny

    cfg = DeepseekV41Config.from_dict({**tiny(), "kv_source_layer_ids": [1, 3, 6, 8]})
    late = ReferenceModel(cfg).eval()
    ids = _ids(40, 6)
    assert not torch.isnan(late(ids)).any()
    with pytest.raises(ConfigError, match=r"kv_source_layer_ids \(layer 8\)"):
        late(ids, replay_floor=cfg.replay_floor(len(ids)))
