"""Capability checks shared by every op's dispatcher.

`DSV41_FORCE_REF=1` forces the torch references. A fast path that was asked for explicitly and
is unavailable raises; it never silently degrades.
"""

import functools
import os

import torch


def force_ref() -> bool:
    return os.environ.get("DSV41_FORCE_REF", "0") not in ("", "0")


@functools.cache
def _capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple:
    """(major, minor) of a CUDA device, (0, 0) for CPU or anything else."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(device: torch.device) -> bool:
    """True when the Triton SM90 kernels should run on tensors living on `device`."""
    return not force_ref() and device_capability(device) >= (9, 0) and has_triton()
