"""On the lent GPU machine only (its folder is put on PYTHONPATH by scripts/gpu_e2e): load the
torch-2.11 shim (shim/torch211_shim.cpp) with RTLD_GLOBAL before the first import of a library
built against torch 2.14, in every Python process (SGLang spawns its scheduler and detokenizer
as fresh interpreters; PYTHONPATH reaches them all).

DSV41_TORCH_SHIM: path of the built shim; unset, nothing is done.
DSV41_OP_CENSUS: a folder; set, the calls into SGLang's kernel libraries are counted there
(op_census.py). The import of `sgl_kernel` or
`deep_gemm` is held back until torch is imported and the shim loaded, so their libraries resolve
the nine symbols against it. Then the next `sitecustomize` on sys.path, if any, runs as it would
have without this one.
"""

import ctypes
import importlib.abc
import importlib.util
import os
import sys

_NEEDS_SHIM = ("sgl_kernel", "deep_gemm")
_loaded = False


def load_shim() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import torch  # noqa: F401  (its libraries first: the shim's forwards resolve against them)

    ctypes.CDLL(os.environ["DSV41_TORCH_SHIM"], mode=os.RTLD_GLOBAL | os.RTLD_NOW)


class _ShimFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in _NEEDS_SHIM:
            load_shim()
        return None


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        spec = importlib.util.spec_from_file_location(
            "_next_sitecustomize", os.path.join(entry or ".", "sitecustomize.py")
        )
        if spec is not None and os.path.isfile(spec.origin):
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("DSV41_TORCH_SHIM"):
    sys.meta_path.insert(0, _ShimFirst())
if os.environ.get("DSV41_OP_CENSUS"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import op_census

    op_census.install()
    sys.path.pop(0)
_chain()

import cuda_key_fix  # noqa: E402,F401  (torch 2.14 kernels registered under 2.11 keys)
