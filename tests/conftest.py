import os
import re
import subprocess
import sys

import pytest
import torch

from sglang_dsv41.kernels.dispatch import triton_interpreting

# Tiny models: one intra-op thread is several times faster than two on the 2-core CI machine,
# where end-to-end server processes run beside the tests.
torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "triton_interpret: run the test in a fresh process under TRITON_INTERPRET=1 (Triton "
        "kernels on CPU tensors; the variable must be set before triton is imported)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A `triton_interpret` test outside an interpreter process re-runs itself in one."""
    if pyfuncitem.get_closest_marker("triton_interpret") is None:
        return None
    if triton_interpreting():
        return None
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0 or not re.search(r"\b1 passed\b", r.stdout):
        pytest.fail(f"under TRITON_INTERPRET=1:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}", False)
    return True
