"""The prefill's shared windows (`kernels/sparse_attn/window_share.py`) on the CPU: the groups'
union and coverage (torch ops the route runs) against the rule `covered_ref`, on slot lists of
several kinds, and the argument checks. The partials themselves run on SM90 only
(tests/gpu/test_sparse_attn.py: test_shared_windows_route)."""

import pytest
import torch
from window_lists import prefill_lists

from sglang_dsv41.kernels.sparse_attn import window_share as ws


def test_coverage_rule():
    """Groups of one request are covered; a group that spans two requests is covered up to its
    last token of the first; the tail (T mod G tokens) and a shuffled token are not; -1 entries
    (a fresh prompt, a floor) are covered like any other."""
    W, H = 16, 16  # four tokens a group
    sw, _ = prefill_lists([9, 8], W, floors=(0, 190))
    cov = ws.covered_ref(sw, H)
    assert ws.group_tokens(H) == 4 and ws.group_tokens(12) is None
    # tokens 0-8 request 0, 9-16 request 1: group 2 (tokens 8-11) spans both, token 16 the tail
    want = torch.ones(17, dtype=torch.bool)
    want[9:12] = False  # their lists are not slices of the union of 8's and 11's windows
    want[16] = False
    assert torch.equal(cov, want), cov


@pytest.mark.parametrize("H", [8, 16])
@pytest.mark.parametrize("lengths, shuffle", [([37], 0), ([9, 20, 3], 2), ([130, 70], 9), ([5], 0)])
def test_union_and_coverage_follow_the_rule(H, lengths, shuffle):
    """The torch ops the route runs equal the rule, and each covered token's list is its slice
    of the union."""
    W = 32
    sw, _ = prefill_lists(lengths, W, floors=(0, 190, 0), shuffle=shuffle, seed=H)
    G = ws.group_tokens(H)
    union, cov = ws.union_and_coverage(sw, G)
    assert cov.dtype == torch.int32 and union.shape == (sw.shape[0] // G, W + G - 1)
    assert torch.equal(cov.bool(), ws.covered_ref(sw, H))
    assert cov.sum() >= sw.shape[0] - G * len(lengths) - 2 * G * shuffle
    for t in cov.nonzero().flatten().tolist():
        assert torch.equal(sw[t], union[t // G, t % G : t % G + W])


def test_window_partials_argument_errors():
    q = torch.zeros(4, 8, 512, dtype=torch.bfloat16)
    swa = torch.zeros(10, 528, dtype=torch.uint8)
    with pytest.raises(ValueError, match="W >= 8"):
        ws.window_partials(q, swa, torch.zeros(4, 4, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="bf16"):
        ws.window_partials(q.float(), swa, torch.zeros(4, 16, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="8 or 16"):
        ws.window_partials(q[:, :5], swa, torch.zeros(4, 16, dtype=torch.int32), 1.0)
