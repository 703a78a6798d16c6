"""The prefill's shared windows (`kernels/sparse_attn/window_share.py`) against the torch
reference, under the Triton interpreter on the CPU: the coverage rule on slot lists of several
kinds, and the partials of covered tokens against `partials_ref` (the window alone through
`layers.sparse_attention.attend_keys`)."""

import pytest
import torch
from window_lists import prefill_lists

from sglang_dsv41.kernels.kv_store import store_records
from sglang_dsv41.kernels.sparse_attn import window_share as ws
from sglang_dsv41.kv.records import Layout, record_bytes


def test_coverage_rule():
    """Groups of one request are covered; a group that spans two requests is covered up to its
    first token of the second one's; a shuffled token is not; -1 windows (a fresh prompt,
    a floor) are covered like any other."""
    W, H = 16, 16  # four tokens a group
    sw, _ = prefill_lists([9, 7], W, floors=(0, 190))
    cov = ws.covered_ref(sw, H)
    G = ws.group_tokens(H)
    assert G == 4
    # tokens 0-8 request 0, 9-15 request 1: group 2 (tokens 8-11) spans both
    want = torch.ones(16, dtype=torch.bool)
    want[9:12] = False  # their lists are not slices of the union of 8's and 11's windows
    assert torch.equal(cov, want), cov


@pytest.mark.triton_interpret
@pytest.mark.parametrize("H", [8, 16, 5])
@pytest.mark.parametrize("lengths, shuffle", [([37], 0), ([9, 20, 3], 2)])
def test_partials_match_the_reference(H, lengths, shuffle):
    """Covered tokens' o_w and lse_w equal the reference; the coverage flags equal the rule."""
    D, W = 64, 16
    sw, n_slots = prefill_lists(lengths, W, floors=(0, 190, 0), shuffle=shuffle)
    T = sw.shape[0]
    swa = torch.full((n_slots, record_bytes(Layout.V41, D)), 0xFF, dtype=torch.uint8)
    used = sw[sw >= 0].unique()
    store_records(torch.randn(used.numel(), D) * 2, swa, used, Layout.V41)
    q = torch.randn(T, H, D).to(torch.bfloat16)
    scale = D**-0.5
    o, lse, cov = ws.window_partials(q, swa, sw, scale)
    assert torch.equal(cov.bool(), ws.covered_ref(sw, H))
    assert cov.sum() >= T // 2
    o_ref, lse_ref = ws.partials_ref(q, swa, sw, scale)
    c = cov.bool()
    torch.testing.assert_close(o[c].float(), o_ref[c], rtol=2**-7, atol=1e-5)
    torch.testing.assert_close(lse[c], lse_ref[c], rtol=1e-5, atol=1e-5)


def test_window_partials_argument_errors():
    q = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    swa = torch.zeros(10, 66, dtype=torch.uint8)
    with pytest.raises(ValueError, match="W >= 8"):
        ws.window_partials(q, swa, torch.zeros(4, 4, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="bf16"):
        ws.window_partials(q.float(), swa, torch.zeros(4, 16, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="int32"):
        ws.window_partials(q, swa, torch.zeros(4, 16, dtype=torch.int64), 1.0)
