"""CUDA C++ kernels built at first use by NVRTC and launched through the driver API (ctypes).

No compiler toolchain is needed where the package is installed: NVRTC ships with PyTorch's CUDA
wheels (`nvidia-cuda-nvrtc`), the driver library with the GPU driver. A build is cached on disk
(~/.cache/sglang-dsv41/cuda, or $SGLANG_DSV41_CUDA_CACHE) by a hash of the source, the options
and the NVRTC version, and loaded once per process and device. Launches go to PyTorch's current
stream, so they are captured by CUDA graphs like any other kernel.

`Kernel(source, name, arch)` builds; `kernel(grid, block, args, stream)` launches, with args as
ctypes values (`c_void_p` for pointers, `c_longlong`, `c_int`, `c_float`). `CudaJitError` says
what is missing (library, compile log) so a caller can fall back to another path.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import sys
import threading


class CudaJitError(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why."""


def _find_lib(names: list[str], patterns: list[str]) -> ctypes.CDLL:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    roots = [p for p in sys.path if os.path.isdir(p)]
    for root in roots:
        for pat in patterns:
            for path in sorted(glob.glob(os.path.join(root, pat)), reverse=True):
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    pass
    raise CudaJitError(f"none of {names} (nor {patterns} under sys.path) could be loaded")


_LOCK = threading.Lock()
_LIBS: dict = {}


def _nvrtc() -> ctypes.CDLL:
    with _LOCK:
        if "nvrtc" not in _LIBS:
            _LIBS["nvrtc"] = _find_lib(
                ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"],
                ["nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu13/lib/libnvrtc.so*",
                 "nvidia/*/lib/libnvrtc.so*", "torch/lib/libnvrtc*.so*"],
            )  # fmt: skip
        return _LIBS["nvrtc"]


def _cuda() -> ctypes.CDLL:
    with _LOCK:
        if "cuda" not in _LIBS:
            _LIBS["cuda"] = _find_lib(["libcuda.so.1", "libcuda.so"], [])
        return _LIBS["cuda"]


def _check_nvrtc(lib, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CudaJitError(f"NVRTC {what}: {lib.nvrtcGetErrorString(rc).decode()}")


def _check_cu(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaJitError(f"CUDA driver {what}: error {rc} ({(msg.value or b'?').decode()})")


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check_nvrtc(_nvrtc(), _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "")
    return major.value, minor.value


def load_source(path: str) -> str:
    """The text of a CUDA source file with each `#include "name"` line of it replaced by the
    file `name` beside it (once per name; NVRTC is given one self-contained string)."""
    seen: set[str] = set()

    def expand(p: str) -> str:
        out = []
        with open(p) as f:
            for line in f.read().split("\n"):
                m = re.match(r'\s*#include\s+"([^"]+)"\s*$', line)
                if not m:
                    out.append(line)
                    continue
                inc = os.path.join(os.path.dirname(p), m.group(1))
                if inc not in seen:
                    seen.add(inc)
                    out.append(expand(inc))
        return "\n".join(out)

    return expand(path)


def compile_cubin(source: str, name: str, arch: str, options: tuple = ()) -> bytes:
    """NVRTC: CUDA C++ source -> cubin for `arch` (e.g. "sm_90a"). Raises CudaJitError with the
    compile log."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check_nvrtc(lib, lib.nvrtcCreateProgram(
        ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None
    ), "create")  # fmt: skip
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", *options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc != 0:
            raise CudaJitError(f"NVRTC could not compile {name}:\n{log.value.decode()}")
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, cubin), "cubin")
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _cache_dir() -> str:
    d = os.environ.get("SGLANG_DSV41_CUDA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "sglang-dsv41", "cuda"
    )
    os.makedirs(d, exist_ok=True)
    return d


def cached_cubin(source: str, name: str, arch: str, options: tuple = ()) -> bytes:
    """`compile_cubin`, cached on disk by a hash of everything that shapes the cubin."""
    key = hashlib.sha256(
        "\0".join([source, name, arch, *options, repr(nvrtc_version())]).encode()
    ).hexdigest()[:24]
    path = os.path.join(_cache_dir(), f"{name}-{arch}-{key}.cubin")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    cubin = compile_cubin(source, name, arch, options)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(cubin)
    os.replace(tmp, path)  # atomic: concurrent builders agree on the bytes
    return cubin


class Kernel:
    """One `extern "C" __global__` function of a source, built for `arch` and loaded per
    device (the current context of that device: PyTorch's primary context)."""

    def __init__(self, source: str, name: str, arch: str, options: tuple = ()):
        self.source, self.name, self.arch, self.options = source, name, arch, tuple(options)
        self._cubin: bytes | None = None
        self._fn: dict[int, ctypes.c_void_p] = {}
        self._smem: set = set()
        self._lock = threading.Lock()

    def cubin(self) -> bytes:
        if self._cubin is None:
            self._cubin = cached_cubin(self.source, self.name, self.arch, self.options)
        return self._cubin

    def function(self, device_index: int) -> ctypes.c_void_p:
        with self._lock:
            if device_index not in self._fn:
                import torch

                with torch.cuda.device(device_index):
                    torch.cuda.init()
                    torch.empty(1, device=f"cuda:{device_index}")  # the primary context, current
                    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
                    _check_cu(_cuda().cuModuleLoadData(ctypes.byref(mod), self.cubin()),
                              f"load {self.name}")  # fmt: skip
                    _check_cu(_cuda().cuModuleGetFunction(
                        ctypes.byref(fn), mod, self.name.encode()
                    ), f"find {self.name}")  # fmt: skip
                self._fn[device_index] = fn
            return self._fn[device_index]

    def _allow_smem(self, fn, device_index: int, smem: int) -> None:
        """Dynamic shared memory above 48 KB must be allowed per function (once per size)."""
        key = (device_index, smem)
        if smem > 48 * 1024 and key not in self._smem:
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            _check_cu(_cuda().cuFuncSetAttribute(
                fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(smem)
            ), f"allow {smem} B of shared memory for {self.name}")  # fmt: skip
            self._smem.add(key)

    def __call__(self, grid, block, args, stream: int, device_index: int, smem: int = 0):
        fn = self.function(device_index)
        self._allow_smem(fn, device_index, smem)
        ptrs = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args]
        )
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        _check_cu(_cuda().cuLaunchKernel(
            fn, gx, gy, gz, bx, by, bz, smem, ctypes.c_void_p(stream), ptrs, None
        ), f"launch {self.name}")  # fmt: skip
