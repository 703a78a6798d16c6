"""scripts/gpu_e2e's machinery for SGLang's compiled kernels on the lent GPU machine:

- the preload hook counts calls into a watched module, once per function, in every process;
- kernel_abi finds every `torch.ops.sgl_kernel` call in a wrapper package with its argument
  count, and reports the ops a loaded library lacks and the calls its schemas do not take.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PRELOAD = ROOT / "scripts/gpu_e2e/preload"
sys.path.insert(0, str(ROOT / "scripts/gpu_e2e"))
import kernel_abi  # noqa: E402


def test_preload_counts_calls_once_per_function(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fakeops.py").write_text("def add(a, b):\n    return a + b\n")
    (mods / "fakepkg.py").write_text("from fakeops import add\n")  # a re-export
    out = tmp_path / "census"
    env = {
        **os.environ,
        "PYTHONPATH": f"{PRELOAD}{os.pathsep}{mods}",
        "DSV41_OP_CENSUS": str(out),
        "DSV41_OP_CENSUS_MODULES": "fakeops,fakepkg",
    }
    code = (
        "import fakepkg\nfrom fakeops import add\nfor _ in range(5): fakepkg.add(1, 2)\nadd(1, 1)"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    sys.path.insert(0, str(PRELOAD))
    try:
        import op_census

        assert op_census.merge(str(out)) == {"fakeops.add": 6}
    finally:
        sys.path.remove(str(PRELOAD))
    (files,) = [list(out.glob("census-*.json"))]
    assert json.loads(files[0].read_text())["calls"] == {"fakeops.add": 6}


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .norm import rmsnorm\n")
    (pkg / "norm.py").write_text(
        "import torch\n"
        "def rmsnorm(out, x, w, eps, pdl):\n"
        "    torch.ops.sgl_kernel.rmsnorm.default(out, x, w, eps, pdl)\n"
        "def topk(s, n, t, o, p, raw=None, sort=False):\n"
        "    torch.ops.sgl_kernel.topk_transform(s, n, t, o, p, raw, sort)\n"
        "def mega(*a):\n"
        "    return torch.ops.sgl_kernel.mega_decode(*a)\n"
        "def other():\n"
        "    return torch.ops.other_ns.thing(1)\n"
    )
    return pkg


def test_wrapper_calls_name_each_op_with_its_argument_count(tmp_path):
    calls = kernel_abi.wrapper_calls(_package(tmp_path))
    assert calls == [
        kernel_abi.OpCall("sgl_kernel.norm.mega", "mega_decode", -1),
        kernel_abi.OpCall("sgl_kernel.norm.rmsnorm", "rmsnorm", 5),
        kernel_abi.OpCall("sgl_kernel.norm.topk", "topk_transform", 7),
    ]


def test_compare_reports_missing_ops_and_calls_the_schema_does_not_take(tmp_path):
    calls = kernel_abi.wrapper_calls(_package(tmp_path))
    schemas = {
        "rmsnorm": kernel_abi.Schema(required=5, total=5),
        "topk_transform": kernel_abi.Schema(required=5, total=6),  # no sort argument
    }
    diffs = kernel_abi.compare(calls, schemas, {"topk_transform": "topk_transform(...)"})
    assert [(d.call.op, d.kind, d.schema) for d in diffs] == [
        ("mega_decode", "missing", ""),
        ("topk_transform", "arity", "topk_transform(...)"),
    ]
    schemas["topk_transform"] = kernel_abi.Schema(required=5, total=7)
    schemas["mega_decode"] = kernel_abi.Schema(required=2, total=2)
    assert kernel_abi.compare(calls, schemas) == []  # a *args call is not counted
