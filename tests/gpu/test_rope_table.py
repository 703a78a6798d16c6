"""RoPE on the GPU: the values the CPU oracle uses, bit for bit (layers/rope.py).

Device positions gather from the host-built table, so they equal the host's values and SGLang's
`precompute_freqs_cis` run on the host. SGLang's in-tree model builds its table on the device
(its loader constructs the model under the device): the same fp32 angles, cos / sin from the
CUDA library, which may differ from the host's by an ulp or two; the last test bounds that.
"""

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.layers import rope

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = torch.device("cuda")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.parametrize("name", ["tiny", "flash"])
@pytest.mark.parametrize("ratio", [0, 1])
def test_device_values_equal_the_host(name, ratio):
    cfg = preset(name)
    inv = rope.rope_inv_freq(cfg, ratio)
    n = cfg.max_position_embeddings
    pos = torch.cat([torch.arange(4096), torch.randint(0, n, (4096,)), torch.tensor([n - 1])])
    want = rope.rope_cos_sin(pos, inv)
    for freqs in (inv, inv.to(DEV)):  # the layer's buffer on the host or moved to the device
        got = rope.rope_cos_sin(pos.to(DEV), freqs)
        assert got.cos.device.type == "cuda"
        assert torch.equal(_bits(got.cos.cpu()), _bits(want.cos))
        assert torch.equal(_bits(got.sin.cpu()), _bits(want.sin))


def test_device_table_is_built_once_and_gathered_inside_a_graph():
    cfg = preset("tiny")
    inv = rope.rope_inv_freq(cfg, 1).to(DEV)
    pos = torch.arange(16, device=DEV)
    rope.rope_cos_sin(pos, inv)  # eager: builds the table
    table = rope.device_table(inv, DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = rope.rope_cos_sin(pos, inv)
    pos.copy_(torch.arange(100, 116, device=DEV))
    g.replay()
    assert rope.device_table(inv, DEV) is table
    want = rope.rope_cos_sin(torch.arange(100, 116), inv.cpu())
    assert torch.equal(_bits(out.cos.cpu()), _bits(want.cos))


def test_sglang_device_table_differs_by_at_most_two_ulps():
    """SGLang's table computed on the device (as its in-tree model does): identical fp32 angles,
    cos / sin within 2 ulp of the host's (CUDA's cosf / sinf error bound)."""
    sglang_rope = pytest.importorskip("sglang.kernels.ops.attention.dsv4.rope")
    cfg = preset("flash")
    rs = cfg.rope_scaling
    inv = rope.rope_inv_freq(cfg, 1)
    n = 1 << 20
    with torch.device(DEV):
        theirs = sglang_rope.precompute_freqs_cis.__wrapped__(
            cfg.qk_rope_head_dim,
            n,
            rs["original_max_position_embeddings"],
            cfg.compress_rope_theta,
            rs["factor"],
            rs["beta_fast"],
            rs["beta_slow"],
        )
    assert theirs.device.type == "cuda"
    ours = rope.rope_cos_sin(torch.arange(n, device=DEV), inv)
    real = torch.view_as_real(theirs)
    for got, want in ((ours.cos, real[..., 0]), (ours.sin, real[..., 1])):
        ulps = (_bits(got).long() - _bits(want.contiguous()).long()).abs()
        differ = int((ulps > 0).sum())
        print(f"entries differing from SGLang's device table: {differ} of {ulps.numel()}")
        assert int(ulps.max()) <= 2
