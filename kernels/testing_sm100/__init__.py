"""Recording stand-ins for `deep_gemm` and `flash_mla`, for the SM100 contract tests on CPU.

Each stand-in function (1) records its arguments, (2) checks them against the library's
documented contract: the host checks DeepGEMM compiles in (sgl-deep-gemm 0.2.3's
csrc/apis/attention.hpp assertions), the scheduler's reading of the block lists, and
FlashMLA's `flash_mla_interface` docstrings, raising AssertionError naming the rule, and (3)
returns what the documented kernel computes, evaluated with this package's reference math
(records decoded by kv.records through the arguments exactly as the library addresses them).
A call whose arguments address the wrong bytes therefore returns the wrong numbers.

These are contract tests, never hardware tests: they cannot show that the real kernels agree
with their documentation. `kernels.sm100_check` (scripts/b200_check.sh) does that on a B200.
"""

from sglang_dsv41.kernels.testing_sm100.common import NUM_SMS, SPLIT_KV, Call
from sglang_dsv41.kernels.testing_sm100.deep_gemm import deep_gemm
from sglang_dsv41.kernels.testing_sm100.flash_mla import SchedMeta, flash_mla

__all__ = ["NUM_SMS", "SPLIT_KV", "Call", "SchedMeta", "deep_gemm", "flash_mla"]
