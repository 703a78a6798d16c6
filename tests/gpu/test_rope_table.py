"""RoPE on the GPU: the values the CPU oracle uses, bit for bit (layers/rope.py).

Device positions gather from the host-built table, so they equal the host's values and SGLang's
`precompute_freqs_cis` run on the host. SGLang's in-tree model builds its table under the
device instead; on the H200 that table differs from the host's in 7.2 M of Flash's 33.5 M
ratio > 0 entries (1 M positions), some by sign, so the device's fp32 frequencies or angles differ
and not only the last ulp of a sine (docs/design.md 2.3).
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
