"""A post-import hook: once a named module has finished importing, call `fn(module)`.

after_import(names, fn)   installs it first on sys.meta_path (the op census uses it)
"""

import importlib.abc
import importlib.util
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, names, fn):
        self.names, self.fn = frozenset(names), fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_call(module, _fn=self.fn):
            exec_module(module)
            _fn(module)

        spec.loader.exec_module = exec_then_call
        return spec


def after_import(names, fn) -> AfterImport:
    finder = AfterImport(names, fn)
    sys.meta_path.insert(0, finder)
    return finder
