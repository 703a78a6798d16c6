"""RoPE tables equal to SGLang's in-tree `precompute_freqs_cis`, bit for bit.

SGLang's V4 attention layer builds one complex64 table per layer kind: dim qk_rope_head_dim,
base compress_rope_theta with original_seq_len = rope_scaling's original length on ratio > 0
layers, rope_theta with original_seq_len 0 (no YaRN) on ratio-0 layers; factor / beta_fast /
beta_slow from rope_scaling (defaults 1, 32, 1). Its kernels read `view_as_real(freqs_cis)`:
(real, imag) = (cos, sin) fp32 per pair. Ours must give the same fp32 bits at every position up
to 1M, for each preset and the released config, whether computed for a few positions, for a
whole table, or gathered from a device table (here the host stands in for the device).
"""

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers import rope
from sglang_dsv41.presets import PRESETS
from sglang_dsv41.weights.release_config import (
    flash_mini_text_config,
    flash_text_config,
    flash_vision_config,
    release_config,
)

sglang_rope = pytest.importorskip("sglang.kernels.ops.attention.dsv4.rope")

N = 1 << 20
CONFIGS = {
    "tiny": lambda: PRESETS["tiny"](),
    "small": lambda: PRESETS["small"](),
    "flash-mini": flash_mini_text_config,
    "flash": lambda: PRESETS["flash"](),
    "release": lambda: release_config(flash_text_config(), flash_vision_config()),
}


def _positions() -> torch.Tensor:
    """0, 1, every power of two below 1M with its neighbours, 1M - 1, a dense range (a 4096-row
    block at an odd offset) and random positions: int64, sorted, unique."""
    pows = [p + d for k in range(1, 20) for p in [1 << k] for d in (-1, 0, 1)]
    dense = torch.arange(999_001, 999_001 + 4096)
    rand = torch.randint(0, N, (4096,), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.tensor([0, 1, N - 1] + pows), dense, rand])
    return torch.unique(pos)


def _sglang_table(cfg: DeepseekV41Config, ratio: int) -> torch.Tensor:
    """SGLang's complex64 [N, R/2] table for a layer of this ratio (its in-tree layer's rule)."""
    rs = cfg.rope_scaling or {}
    return sglang_rope.precompute_freqs_cis(
        dim=cfg.qk_rope_head_dim,
        seqlen=N,
        original_seq_len=rs["original_max_position_embeddings"] if ratio else 0,
        base=cfg.compress_rope_theta if ratio else cfg.rope_theta,
        factor=rs.get("factor", 1.0),
        beta_fast=rs.get("beta_fast", 32),
        beta_slow=rs.get("beta_slow", 1),
    )


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.fixture(scope="module", autouse=True)
def _free_sglang_tables():
    yield
    sglang_rope.precompute_freqs_cis.cache_clear()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tables_equal_sglang_bit_for_bit(name):
    cfg = DeepseekV41Config.from_dict(CONFIGS[name]())
    assert cfg.rope_scaling["original_max_position_embeddings"] > 0
    pos = _positions()
    kinds = sorted({min(cfg.ratio(i), 1) for i in range(cfg.num_hidden_layers)})
    assert kinds == [0, 1], kinds  # every preset has both kinds of layer
    for ratio in kinds:
        inv = rope.rope_inv_freq(cfg, ratio)
        assert inv.dtype == torch.float32 and inv.shape == (cfg.qk_rope_head_dim // 2,)
        theirs = torch.view_as_real(_sglang_table(cfg, ratio))  # [N, R/2, 2]: cos, sin
        want_cos, want_sin = theirs[pos, :, 0], theirs[pos, :, 1]
        cos, sin = rope.rope_cos_sin(pos, inv)
        assert torch.equal(_bits(cos), _bits(want_cos)), (name, ratio)
        assert torch.equal(_bits(sin), _bits(want_sin)), (name, ratio)
        # position 1's angle is the frequency itself: the fp32 frequencies are SGLang's
        ang1 = (torch.tensor([1.0]) * inv)[None]
        unit1 = torch.view_as_real(torch.polar(torch.ones_like(ang1), ang1))[0]
        assert torch.equal(_bits(unit1), _bits(theirs[1])), (name, ratio)
        # a whole table (the device table's host build) holds the same rows
        table = rope.host_cos_sin(torch.arange(N), inv)
        assert torch.equal(_bits(table.cos), _bits(theirs[..., 0])), (name, ratio)
        assert torch.equal(_bits(table.sin), _bits(theirs[..., 1])), (name, ratio)
        sglang_rope.precompute_freqs_cis.cache_clear()


def test_float64_positions_are_not_the_rule():
    """The fp32 angle is the rule: an fp64 angle (rounded once) gives other values past a few
    thousand positions, the difference this test file exists to keep out."""
    cfg = DeepseekV41Config.from_dict(PRESETS["tiny"]())
    inv = rope.rope_inv_freq(cfg, 1)
    pos = torch.arange(1500, 1600)
    cos, _ = rope.rope_cos_sin(pos, inv)
    fp64 = torch.cos(pos.double()[:, None] * inv.double()[None, :]).float()
    assert float((cos - fp64).abs().max()) > 1e-6


def test_device_table_rows_equal_the_direct_values():
    """`device_table` on the host device: the table of noted positions, built once and reused,
    row for row the values `rope_cos_sin` computes for the positions alone; frequencies with no
    noted length have no table."""
    cfg = DeepseekV41Config.from_dict(PRESETS["small"]())
    inv = rope.rope_inv_freq(cfg, 1)
    host = torch.device("cpu")
    table = rope.device_table(inv, host)
    assert table.cos.shape == (cfg.max_position_embeddings, cfg.qk_rope_head_dim // 2)
    assert rope.device_table(inv.clone(), host) is table  # one table per frequencies
    pos = torch.tensor([0, 1, 7, 1023, 2048, cfg.max_position_embeddings - 1])
    cos, sin = rope.rope_cos_sin(pos, inv)
    assert torch.equal(_bits(table.cos[pos]), _bits(cos))
    assert torch.equal(_bits(table.sin[pos]), _bits(sin))
    other = inv * 0.5
    assert rope.device_table(other, host) is None
    rope.note_positions(other, 64)
    assert rope.device_table(other, host).cos.shape[0] == 64
    rope.note_positions(other, 128)  # a config with more positions: a longer table
    assert rope.device_table(other, host).cos.shape[0] == 128


def test_frequencies_ignore_the_default_device():
    """Built on the host even under a default-device context (SGLang's loader builds models
    under `with torch.device(...)`; the oracle under the meta device)."""
    cfg = DeepseekV41Config.from_dict(PRESETS["tiny"]())
    want = rope.rope_inv_freq(cfg, 1)
    with torch.device("meta"):
        got = rope.rope_inv_freq(cfg, 1)
    assert got.device.type == "cpu" and torch.equal(got, want)
