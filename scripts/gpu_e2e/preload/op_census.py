"""Count the calls into SGLang's compiled kernel libraries, per process (DSV41_OP_CENSUS=DIR).

Installed by sitecustomize.py when DSV41_OP_CENSUS is set: once one of CENSUS_MODULES (and of
the comma-separated DSV41_OP_CENSUS_MODULES) is
imported, every public function of it (and of the submodules listed) is wrapped by a counter;
the ops registered under `torch.ops.sgl_kernel` are counted where they are called through the
Python wrappers (sgl_kernel's own modules), which is how SGLang calls them. At exit each process
writes DIR/census-PID.json: {"pid", "argv", "calls": {"module.function": count}}, and
every 5 s before that (SGLang's workers may be killed rather than exit). A function reached
under two names (a package re-exporting its submodule's function) counts once, under the
submodule's name.
`python op_census.py DIR` merges a folder into one table (used by head_to_head.sh).

Counting costs a Python call per kernel call: it is on for the correctness runs, off for the
timed ones.
"""

import atexit
import collections
import functools
import inspect
import json
import os
import sys
import threading

from post_import import after_import

CENSUS_MODULES = (
    "sgl_kernel",
    "sgl_kernel.elementwise",
    "sgl_kernel.gemm",
    "sgl_kernel.moe",
    "sgl_kernel.sampling",
    "sgl_kernel.attention",
    "deep_gemm",
    "flash_mla",
    "flash_mla.flash_mla_interface",
    "flashinfer",
    "flashinfer.fused_moe",
    "flashinfer.mhc",
    "flashinfer.gemm",
    "sglang.kernels.ops.layernorm.mhc",
    "sglang.kernels.ops.moe.moe_wna16_marlin",
    "sglang.kernels.ops.attention.flash_mla_interface",
)
CENSUS_MODULES += tuple(
    m.strip() for m in os.environ.get("DSV41_OP_CENSUS_MODULES", "").split(",") if m.strip()
)
_calls: collections.Counter = collections.Counter()
_wrapped: set = set()


def _wrap(module) -> None:
    name = module.__name__
    if name in _wrapped:
        return
    _wrapped.add(name)
    for attr, fn in list(vars(module).items()):
        if attr.startswith("_") or not callable(fn) or inspect.isclass(fn):
            continue
        if getattr(fn, "__census__", False):
            continue  # already counted under the module that defines it
        if getattr(fn, "__module__", "") and not str(fn.__module__).startswith(name.split(".")[0]):
            continue  # re-exported torch / typing helpers
        key = f"{name}.{attr}"

        def counted(*args, __fn=fn, __key=key, **kwargs):
            _calls[__key] += 1
            return __fn(*args, **kwargs)

        counted.__census__ = True
        try:
            setattr(module, attr, functools.wraps(fn)(counted))
        except (AttributeError, TypeError):
            pass


def _dump() -> None:
    out = os.environ["DSV41_OP_CENSUS"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"census-{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "argv": sys.argv[:3], "calls": dict(_calls)}, f)


def _every(seconds: float) -> None:
    while True:
        threading.Event().wait(seconds)
        _dump()


def install() -> None:
    after_import(CENSUS_MODULES, _wrap)  # wrap each watched module once it is imported
    atexit.register(_dump)
    threading.Thread(target=_every, args=(5.0,), daemon=True).start()


def merge(folder: str) -> dict:
    """name -> total calls over every census-*.json in folder."""
    total: collections.Counter = collections.Counter()
    for f in sorted(os.listdir(folder)):
        if f.startswith("census-") and f.endswith(".json"):
            with open(os.path.join(folder, f)) as fh:
                total.update(json.load(fh)["calls"])
    return dict(total)


if __name__ == "__main__":
    for k, v in sorted(merge(sys.argv[1]).items(), key=lambda kv: -kv[1]):
        print(f"{v:10d}  {k}")
