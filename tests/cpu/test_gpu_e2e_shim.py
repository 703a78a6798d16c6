"""scripts/gpu_e2e's machinery for SGLang's compiled kernels on the lent H200's torch 2.11.

- the shim defines exactly the nine torch-2.14 symbols it documents, and only those;
- every one of them is imported by the installed sgl-kernel sm90 op library or DeepGEMM;
- with DSV41_TORCH211_LIB=<torch 2.11's lib folder> (the wheel's `torch/lib`, ~1 GB unpacked):
  the shim links against it with --no-undefined (every 2.11 twin exists), and the two
  libraries fail to load against torch 2.11 without the shim (the undefined-symbol error the
  H200 showed) and load with it, their op registrations running through its forwards (libcuda
  is a stand-in library here: no driver call is made at load);
- the preload hook counts calls into a watched module, once per function, in every process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SHIM = ROOT / "scripts/gpu_e2e/shim"
PRELOAD = ROOT / "scripts/gpu_e2e/preload"
SYMBOLS = {
    "_ZN3c104cuda19CUDAErrorLogCaptureC1Ev",
    "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE",
    "_ZN3c1019NotImplementedErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorINS_10headeronly3TagESaIS8_EENS_17_RegisterOrVerifyE",
    "_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorINS_10headeronly3TagESaISB_EE",
    "_ZNK2at10TensorBase14const_data_ptrIfEEPKT_v",
    "torch_exception_get_what",
    "torch_exception_get_what_without_backtrace",
}  # fmt: skip


def _nm(path: Path, *flags) -> set:
    out = subprocess.run(["nm", "-D", *flags, str(path)], capture_output=True, text=True)
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


def _kernel_libraries() -> list:
    try:
        import deep_gemm  # noqa: F401  (only its location is needed)
    except Exception:
        pass
    import importlib.util

    libs = []
    for pkg, rel in (("sgl_kernel", "sm90/common_ops.abi3.so"), ("deep_gemm", "_C.so")):
        spec = importlib.util.find_spec(pkg)
        if spec and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / rel
            if path.exists():
                libs.append(path)
    return libs


@pytest.fixture(scope="module")
def shim_object(tmp_path_factory):
    if not shutil.which("g++") or not shutil.which("nm"):
        pytest.skip("needs g++ and nm")
    out = tmp_path_factory.mktemp("shim") / "shim.so"
    # a shared object whose twins stay undefined: enough to read what it defines
    subprocess.run(
        ["g++", "-std=c++17", "-O2", "-fPIC", "-shared", "-o", str(out),
         str(SHIM / "torch211_shim.cpp")],
        check=True,
    )  # fmt: skip
    return out


def test_shim_defines_exactly_the_documented_symbols(shim_object):
    defined = _nm(shim_object, "--defined-only") - {"_init", "_fini"}
    assert defined == SYMBOLS


def test_every_shim_symbol_is_imported_by_a_kernel_library(shim_object):
    libs = _kernel_libraries()
    if len(libs) < 2:
        pytest.skip("sglang-kernel's sm90 library or DeepGEMM is not installed here")
    wanted = set().union(*(_nm(lib, "--undefined-only") for lib in libs))
    assert SYMBOLS <= wanted
    assert {s for s in SYMBOLS if "Capture" in s} <= _nm(libs[0], "--undefined-only")


LOAD = """
import ctypes, os, sys
G = os.RTLD_GLOBAL | os.RTLD_NOW
for name in ("libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_cuda.so", "libtorch.so"):
    ctypes.CDLL(os.path.join(sys.argv[1], name), mode=G)
if sys.argv[2] != "-":
    ctypes.CDLL(sys.argv[2], mode=G)
for lib in sys.argv[3:]:
    try:
        ctypes.CDLL(lib, mode=os.RTLD_NOW)
        print("LOADED", lib)
    except OSError as e:
        print("FAILED", lib, e)
"""


@pytest.mark.skipif(not os.environ.get("DSV41_TORCH211_LIB"), reason="DSV41_TORCH211_LIB not set")
def test_libraries_load_on_torch_211_with_the_shim_only(tmp_path):
    lib211 = os.environ["DSV41_TORCH211_LIB"]
    libs = [str(p) for p in _kernel_libraries()]
    assert len(libs) == 2
    shim = tmp_path / "libtorch211_shim.so"
    subprocess.run(["bash", str(SHIM / "build.sh"), str(shim), lib211], check=True)
    fake = tmp_path / "fakecuda"
    fake.mkdir()
    (fake / "fake.c").write_text(
        "int cuPointerGetAttribute(void* d, int a, unsigned long long p) { return 1; }\n"
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(fake / "libcuda.so.1"), str(fake / "fake.c")],
        check=True,
    )
    import torch

    nv = [str(p) for p in (Path(torch.__file__).parents[1] / "nvidia").glob("*/lib")]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(nv + [lib211, str(fake)])}
    runs = {}
    for name, arg in (("without", "-"), ("with", str(shim))):
        out = subprocess.run(
            [sys.executable, "-c", LOAD, lib211, arg, *libs], env=env, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        runs[name] = out.stdout
    assert runs["without"].count("FAILED") == 2 and "CUDAErrorLogCapture" in runs["without"]
    assert runs["with"].count("LOADED") == 2, runs["with"]


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


def test_shim_hook_loads_before_the_first_import(tmp_path):
    mods = tmp_path / "mods"
    (mods / "sgl_kernel").mkdir(parents=True)
    (mods / "sgl_kernel" / "__init__.py").write_text("import torch\n")
    lib = tmp_path / "libmark.so"
    src = tmp_path / "mark.c"
    src.write_text("int dsv41_shim_marker(void) { return 42; }\n")
    if not shutil.which("gcc"):
        pytest.skip("needs gcc")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    env = {**os.environ, "PYTHONPATH": f"{PRELOAD}{os.pathsep}{mods}", "DSV41_TORCH_SHIM": str(lib)}
    code = (
        "import ctypes, sgl_kernel\n"
        "print(ctypes.CDLL(None).dsv41_shim_marker())\n"  # visible globally: RTLD_GLOBAL
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "42", out.stderr[-1500:]


def test_cuda_key_fix_gives_cpu_only_ops_a_cuda_kernel():
    """preload/cuda_key_fix: an op of the namespace with a CPU kernel and none for CUDA gets one
    (once); ops that have a CUDA kernel and other namespaces are left alone."""
    code = """
import sys, torch
sys.path.insert(0, sys.argv[1])
lib = torch.library.Library("dsv41keytest", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.define("both(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CPU")
lib.impl("both", lambda x: x + 1, "CPU")
lib.impl("both", lambda x: x + 1, "CUDA")
import cuda_key_fix
has = torch._C._dispatch_has_kernel_for_dispatch_key
assert not has("dsv41keytest::twice", "CUDA")
assert cuda_key_fix.fix("dsv41keytest") == 1
assert has("dsv41keytest::twice", "CUDA") and cuda_key_fix.fix("dsv41keytest") == 0
assert torch.equal(torch.ops.dsv41keytest.twice(torch.ones(3)), torch.full((3,), 2.0))
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(PRELOAD)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
