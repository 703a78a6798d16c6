"""stable_linear: a row's result does not depend on how many rows or columns share the product."""

import pytest
import torch
import torch.nn.functional as F

from sglang_dsv41.layers.linear import Linear, stable_linear


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k, n", [(64, 32), (32, 256), (512, 64), (64, 1)])
def test_rows_do_not_depend_on_batch(threads, k, n):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w, x = torch.randn(n, k), torch.randn(300, k)
        full = stable_linear(x, w)
        torch.testing.assert_close(full, F.linear(x, w), rtol=1e-5, atol=1e-4)
        for m in range(1, 40):
            assert torch.equal(stable_linear(x[:m], w), full[:m]), m
            assert torch.equal(stable_linear(x[7 : 7 + m], w), full[7 : 7 + m]), m
    finally:
        torch.set_num_threads(old)


def test_columns_do_not_depend_on_count():
    x, w = torch.randn(40, 32), torch.randn(300, 32)
    full = stable_linear(x, w)
    for n in (1, 2, 5, 17, 299):
        assert torch.equal(stable_linear(x, w[:n]), full[:, :n])


def test_linear_module_keeps_names_and_shapes():
    lin = Linear(8, 3)
    assert set(lin.state_dict()) == {"weight"} and lin.weight.shape == (3, 8)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(lin(x), x @ lin.weight.T)
