"""On the lent GPU machine only (its folder is put on PYTHONPATH by scripts/gpu_e2e): in every
Python process (SGLang spawns its scheduler and detokenizer as fresh interpreters; PYTHONPATH
reaches them all), count the calls into SGLang's kernel libraries when DSV41_OP_CENSUS names a
folder (op_census.py), and with DSV41_STACK_EVERY_S=N print every thread's Python stack to
stderr every N seconds (where a server spends a long first forward: kernel builds, a host loop).
Then the next `sitecustomize` on sys.path, if any, runs as it would have without this one.

The kernel libraries themselves are torch-2.11 builds (wheels-kernels.txt) and load natively.
"""

import importlib.util
import os
import sys


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


if os.environ.get("DSV41_OP_CENSUS"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import op_census

    op_census.install()
    sys.path.pop(0)
if os.environ.get("DSV41_STACK_EVERY_S"):
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ["DSV41_STACK_EVERY_S"]), repeat=True)
_chain()
