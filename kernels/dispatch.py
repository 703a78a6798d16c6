"""Which implementation of an op runs: a cached capability check plus the op's own limits.

Paths, best first: `sm100` (DeepGEMM / FlashMLA library kernels, SM100 / SM103), `triton` (SM90
and newer), `ref` (the torch references: CPU, other GPUs). An op lists the fast paths it has and,
for each, a check that returns None or the reason the call's configuration (shapes, layouts,
geometry, installed libraries) cannot run there. `select` walks the device's paths in order and
logs once per distinct reason which path runs instead (logging, never print).

Environment (read per call, so tests and users can switch without restarting):
    DSV41_FORCE_REF=1        the torch references everywhere
    DSV41_FORCE_FAST=1       the device's fast path must run: where it cannot (an unsupported
                             configuration, a missing library, a CPU tensor) the call raises
                             with the reason instead of falling back
    DSV41_KERNEL_PATH=P      P in {ref, triton, sm100}: that path for every op that has it (ops
                             without it take their next fast path); raises where it cannot run.
                             `triton` on CPU tensors needs TRITON_INTERPRET=1.
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
import os
from collections.abc import Callable, Mapping

import torch

logger = logging.getLogger("sglang_dsv41.kernels")


class Path(str, enum.Enum):
    SM100 = "sm100"
    TRITON = "triton"
    REF = "ref"


FAST_PATHS = (Path.SM100, Path.TRITON)  # best first

# index-K page of the SM100 path: DeepGEMM's paged sparse logits need a page stride that is a
# multiple of 512 B; 128 slots x 68 B = 17 x 512 B (64 slots would be 8.5 x 512 B)
SM100_INDEX_PAGE = 128


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def force_ref() -> bool:
    return _flag("DSV41_FORCE_REF") or os.environ.get("DSV41_KERNEL_PATH") == Path.REF.value


def forced_path() -> Path | None:
    """The path DSV41_KERNEL_PATH / DSV41_FORCE_REF ask for, or None (automatic)."""
    if force_ref():
        return Path.REF
    name = os.environ.get("DSV41_KERNEL_PATH", "")
    if not name:
        return None
    try:
        return Path(name)
    except ValueError:
        raise ValueError(
            f"DSV41_KERNEL_PATH={name!r}: expected one of {[p.value for p in Path]}"
        ) from None


def force_fast() -> bool:
    """True when a fast path was asked for: falling back to a reference must raise."""
    return _flag("DSV41_FORCE_FAST") or forced_path() in FAST_PATHS


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


TRITON_TRUE = ("1", "true", "on", "yes", "y")  # the values Triton's own boolean switches accept


def triton_interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter: TRITON_INTERPRET read as Triton reads it
    (TRITON_TRUE, any case), per call. Every reader of the variable asks here."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in TRITON_TRUE


def device_paths(device: torch.device) -> tuple[Path, ...]:
    """Fast paths that tensors on `device` can take, best first (capability only)."""
    cap = device_capability(device)
    paths = []
    if cap[0] == 10:  # SM100 / SM103 (B200, B300, GB200, GB300)
        paths.append(Path.SM100)
    if has_triton():
        if cap >= (9, 0):
            paths.append(Path.TRITON)
        elif device.type == "cpu" and triton_interpreting() and forced_path() is Path.TRITON:
            paths.append(Path.TRITON)  # the interpreter, only when asked for
    return tuple(paths)


def older_than(version: str, minimum: tuple[int, ...]) -> bool:
    """True when a version string's leading numbers ("0.2.3.post2" -> (0, 2, 3)) are below
    `minimum`; an unreadable version is not judged older."""
    nums = []
    for part in str(version).split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        nums.append(int(digits))
    return bool(nums) and tuple(nums[: len(minimum)]) < minimum


@functools.cache
def log_once(message: str) -> None:
    """Log `message` at warning level the first time it is seen in this process."""
    logger.warning(message)


Check = Callable[[], "str | None"]


def select(op: str, device: torch.device, fast: Mapping[Path, Check]) -> Path:
    """The path that runs `op` for tensors on `device`.

    fast: the op's fast paths, each with a check returning None (can run) or the reason it
    cannot for this call. Ops run the first device path they have whose check passes; a path
    skipped for a reason is logged once; with DSV41_FORCE_FAST / DSV41_KERNEL_PATH set, a call
    that cannot take the asked-for path raises RuntimeError naming the op and the reasons.
    """
    forced = forced_path()
    if forced is Path.REF:
        return Path.REF
    avail = device_paths(device)
    if not avail and forced is None and not _flag("DSV41_FORCE_FAST"):
        return Path.REF  # CPU and older GPUs: nothing to choose, nothing to log
    order = [p for p in FAST_PATHS if p in fast and p in avail]
    if forced is not None and forced in fast:
        order = [forced] if forced in avail else []
        if not order:
            raise RuntimeError(
                f"{op}: DSV41_KERNEL_PATH={forced.value} cannot run on {device} "
                f"(capability {device_capability(device)}, fast paths here: "
                f"{[p.value for p in avail] or 'none'})"
            )
    skipped = []
    for path in order:
        reason = fast[path]()
        if reason is None:
            for p, why in skipped:
                log_once(f"{op}: the {p.value} path cannot run ({why}); running {path.value}")
            return path
        skipped.append((path, reason))
    if force_fast():
        why = "; ".join(f"{p.value}: {r}" for p, r in skipped) or (
            f"no fast path on {device} (capability {device_capability(device)})"
        )
        raise RuntimeError(f"{op}: a fast path was forced but cannot run: {why}")
    for p, why in skipped:
        log_once(f"{op}: the {p.value} path cannot run ({why}); running the torch reference")
    return Path.REF


def index_page_size(device: torch.device) -> int:
    """Slots per index-K page for a pool on `device`: the pool asks this before it allocates.

    SM100_INDEX_PAGE (128) on SM100 / SM103 when DeepGEMM's paged index kernels are installed and
    no other path is forced: split pages (kv/split_pages.py; 128 x 64 value bytes, then
    128 x 4 scale bytes, 17 x 512 B) with a page table in units of 128 entries. Otherwise 1: one
    68 B record per slot, what the Triton kernels and the references address (a split page of
    one slot is the same bytes).
    """
    if Path.SM100 not in device_paths(device) or forced_path() in (Path.REF, Path.TRITON):
        return 1
    from sglang_dsv41.kernels.indexer import sm100

    return SM100_INDEX_PAGE if sm100.missing() is None else 1
