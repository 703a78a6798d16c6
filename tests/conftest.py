import os
import sys

import pytest
import torch

# Tiny models: one intra-op thread is several times faster than two on the 2-core CI machine,
# where end-to-end server processes run beside the tests.
torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
