"""The served model's CPU thread rule: one thread below hidden 1024, overridable."""

from __future__ import annotations

import pytest

from sglang_dsv41.sglang.cpu_threads import choose_threads


def test_narrow_models_get_one_thread_wide_ones_torch_default():
    assert choose_threads(64, {}) == 1
    assert choose_threads(1023, {}) == 1
    assert choose_threads(1024, {}) is None
    assert choose_threads(5120, {}) is None


def test_overrides():
    assert choose_threads(64, {"DSV41_CPU_THREADS": "2"}) == 2
    assert choose_threads(5120, {"DSV41_CPU_THREADS": "3"}) == 3
    assert choose_threads(64, {"DSV41_CPU_THREADS": "0"}) is None
    assert choose_threads(64, {"OMP_NUM_THREADS": "2"}) is None
    assert choose_threads(64, {"OMP_NUM_THREADS": "2", "DSV41_CPU_THREADS": "1"}) == 1
    for bad in ("-1", "two"):
        with pytest.raises(ValueError, match="DSV41_CPU_THREADS"):
            choose_threads(64, {"DSV41_CPU_THREADS": bad})
