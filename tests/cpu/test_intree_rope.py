"""The YaRN rule (docs/design.md 2.3): a ratio > 0 layer uses YaRN whenever `rope_scaling` gives
an original length, whatever max_position_embeddings says; ratio-0 layers never do.

flash-mini keeps the release's rope_scaling (factor 16, original 65536) with
max_position_embeddings 4096 < 65536: the case where a `max_pos > original` test disagrees with
the specification (and with SGLang's in-tree `precompute_freqs_cis`) on 38 of its 40 layers.
"""

import math

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.layers.rope import rope_inv_freq, yarn_inv_freq
from sglang_dsv41.weights.release_config import flash_mini_text_config


def _plain(dim: int, base: float) -> torch.Tensor:
    """1 / base^(2i / dim), every step in fp32 (as the released model's tables)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


@pytest.fixture(scope="module")
def mini():
    cfg = DeepseekV41Config.from_dict(flash_mini_text_config())
    assert cfg.max_position_embeddings < cfg.rope_scaling["original_max_position_embeddings"]
    return cfg


def test_compressed_layers_use_yarn_below_the_original_length(mini):
    R, rs = mini.qk_rope_head_dim, mini.rope_scaling
    yarn = yarn_inv_freq(
        R,
        mini.compress_rope_theta,
        rs["factor"],
        rs["original_max_position_embeddings"],
        rs["beta_fast"],
        rs["beta_slow"],
    )
    plain = _plain(R, mini.compress_rope_theta)
    assert float((plain / yarn).max()) == pytest.approx(16, rel=1e-5)  # slow dims / factor
    compressed = [i for i in range(mini.num_hidden_layers) if mini.ratio(i) > 0]
    assert len(compressed) == 38
    for i in compressed:
        assert torch.equal(rope_inv_freq(mini, mini.ratio(i)), yarn), i
    assert torch.equal(rope_inv_freq(mini, 0), _plain(R, mini.rope_theta))


def test_no_original_length_no_yarn(mini):
    for rs in (None, {}, {"type": "yarn", "factor": 16}):
        cfg = DeepseekV41Config.from_dict({**mini.to_dict(), "rope_scaling": rs})
        got = rope_inv_freq(cfg, 1)
        assert torch.equal(got, _plain(cfg.qk_rope_head_dim, cfg.compress_rope_theta)), rs


def test_matches_sglang_precompute_freqs_cis(mini):
    """SGLang's in-tree V4 attention builds its tables with original_seq_len = the original
    length on ratio > 0 layers and 0 on ratio-0 layers; the angle at position 1 is inv_freq."""
    rope = pytest.importorskip("sglang.kernels.ops.attention.dsv4.rope")
    rs = mini.rope_scaling
    for ratio, base in ((0, mini.rope_theta), (1, mini.compress_rope_theta)):
        table = rope.precompute_freqs_cis(
            dim=mini.qk_rope_head_dim,
            seqlen=2,
            original_seq_len=rs["original_max_position_embeddings"] if ratio else 0,
            base=base,
            factor=rs["factor"],
            beta_fast=rs["beta_fast"],
            beta_slow=rs["beta_slow"],
        )
        theirs = torch.angle(table[1]).double()
        ours = rope_inv_freq(mini, ratio).double()
        assert torch.allclose(ours, theirs, rtol=2e-6, atol=0), (ratio, ours, theirs)
        assert float(ours.max()) <= math.pi
