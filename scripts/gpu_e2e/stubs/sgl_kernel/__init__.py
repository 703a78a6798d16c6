"""Stand-in for `sgl_kernel` (SGLang's compiled CUDA kernels, 1.2 GB) on a GPU machine that
cannot install it: every name imports, every call raises NotImplementedError and is logged.

Each lookup and call is appended to $STUB_CALL_LOG (stderr when unset), so a run shows whether
SGLang reached one of these kernels: a path that did is not tested by that run. The plugin's own
kernels are Triton and do not need this package.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import types

__version__ = "0.4.10+stub"
STUB = True


def _log(kind: str, name: str) -> None:
    line = f"[stub] {kind} {name} pid={os.getpid()}\n"
    target = os.environ.get("STUB_CALL_LOG")
    try:
        if target:
            with open(target, "a") as f:
                f.write(line)
        else:
            sys.stderr.write(line)
    except OSError:
        pass


class _Missing:
    """A kernel that is not there: attribute lookups chain, calls raise."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        _log("CALL", self._name)
        raise NotImplementedError(f"{self._name}: sgl_kernel is a stub on this machine")

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<missing {self._name}>"


def _getattr_for(module_name: str):
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _log("getattr", f"{module_name}.{name}")
        return _Missing(f"{module_name}.{name}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `sgl_kernel.x.y` imports as an empty package of missing kernels."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _getattr_for(spec.name)
        _log("import", spec.name)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Submodules())
__getattr__ = _getattr_for(__name__)
