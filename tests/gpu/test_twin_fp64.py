"""The cached serving path on CUDA equals the oracle in float64 (tools/twin_check.py).

In float64 no cached value lands within rounding of an FP8 / FP4 boundary, so the serving path on
the GPU (toy scheduler, the kernels' torch references on the device: the fast paths take bf16 /
fp32) must give the oracle's tokens on every prompt and its logprobs to twin_check.TOL, where in
fp32 CUDA and CPU arithmetic legitimately send some prompts elsewhere (docs/gpu_e2e.md,
"Rounding"). The oracle runs on the CPU: a cross-device check.
"""

import os

import pytest
import torch

from sglang_dsv41.serving.toy import prompts, toy_model
from sglang_dsv41.tools import twin_check

DEVICE = os.environ.get("DSV41_GPU_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"
)


@pytest.mark.parametrize("chunk, in_flight", [(64, 8), (9, 3)])
def test_serving_on_the_device_equals_the_oracle_in_float64(chunk, in_flight):
    model = toy_model().double()
    lens = [1, 5, 16, 17, 41, 66, 97, 131, 150, 201] if DEVICE == "cuda" else [5, 41]
    answers = {"prompts": prompts(lens, seed=11), "new": 8}
    res = twin_check.run(model, answers, torch.device(DEVICE), chunk=chunk, in_flight=in_flight)
    bad = [(m, r) for m, rows in res["modes"].items() for r in rows if r["verdict"] != "equal"]
    assert res["passed"], bad
