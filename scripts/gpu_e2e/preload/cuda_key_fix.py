"""Torch 2.14's dispatch-key numbering, seen from torch 2.11: the kernel libraries built against
2.14 (sgl_kernel's common_ops, DeepGEMM's _C) register their CUDA kernels under a key that 2.11
reads as CPU ("Could not run 'sgl_kernel::rmsnorm' with arguments from the 'CUDA' backend ...
only available for these backends: [CPU, Meta, ...]"). After such a library is imported, every
op of its namespace with a CPU kernel and no CUDA kernel gets a CUDA kernel that redispatches to
that CPU entry (the library's CUDA code). Test infrastructure for the lent H200 only.
"""

import sys

from post_import import after_import

_NAMESPACES = {"sgl_kernel": "sgl_kernel", "deep_gemm": "deep_gemm"}
_LIBS = []


def fix(ns: str) -> int:
    import torch

    lib = torch.library.Library(ns, "IMPL")
    _LIBS.append(lib)
    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    n = 0
    for qual in torch._C._dispatch_get_registrations_for_dispatch_key("CPU"):
        if not qual.startswith(ns + "::"):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CUDA"):
            continue
        name = qual.split("::", 1)[1]
        opname, _, overload = name.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")

        def kernel(*args, _op=op, **kwargs):
            return _op.redispatch(cpu, *args, **kwargs)

        lib.impl(name, kernel, "CUDA")
        n += 1
    print(f"cuda_key_fix: {ns}: {n} ops given a CUDA kernel", file=sys.stderr, flush=True)
    return n


def _fix_quietly(module) -> None:
    try:
        fix(_NAMESPACES[module.__name__])
    except Exception as e:  # the import stands; the ops stay as they were
        print(f"cuda_key_fix: {module.__name__}: {type(e).__name__}: {e}", file=sys.stderr)


after_import(_NAMESPACES, _fix_quietly)
