import os
import sys

import pytest
import torch

# Tiny models: one intra-op thread is several times faster than two on the 2-core CI machine,
# where end-to-end server processes run beside the tests.
torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "interpreter: runs Triton kernels on CPU tensors under TRITON_INTERPRET=1; scripts/test.sh "
        "runs these in their own pytest process (the variable must be set before Triton loads)",
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (pytest -m interpreter)")
    for item in items:
        if "interpreter" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
