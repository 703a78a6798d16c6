"""Progress of the checkpoint writers on stderr: a bar on a terminal, else a line per quarter."""

from __future__ import annotations

import sys


def progress(done: int, total: int, what: str, stream=None) -> None:
    """Report `done` of `total` steps of `what` (call once per step, done = 1..total)."""
    stream = stream or sys.stderr
    if stream.isatty():
        bar = "#" * (30 * done // total)
        stream.write(f"\r{what} [{bar:<30}] {done}/{total}")
        if done == total:
            stream.write("\n")
    elif done == total or done * 4 // total != (done - 1) * 4 // total:
        stream.write(f"{what}: {done}/{total}\n")
    stream.flush()
