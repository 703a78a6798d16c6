"""`kernels.dispatch.triton_interpreting`, the one reader of TRITON_INTERPRET, agrees with
Triton's own reading of the variable."""

import pytest

from sglang_dsv41.kernels.dispatch import triton_interpreting

VALUES = ["1", "true", "TRUE", "On", "yes", "Y", "2", "0", " 1", "", "no", "off"]


def test_triton_interpreting_reads_the_variable_as_triton_does(monkeypatch):
    triton = pytest.importorskip("triton")
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        pytest.skip("this Triton has no knobs module")
    seen = set()
    for value in VALUES:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        ours = triton_interpreting()
        assert ours == bool(knobs.runtime.interpret), repr(value)
        seen.add(ours)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not triton_interpreting() and seen == {True, False}
