"""Checkpoint writers report progress on stderr: a line per quarter, or a bar on a terminal."""

from __future__ import annotations

import io

from sglang_dsv41.tools.progress import progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_per_quarter_when_not_a_terminal():
    out = io.StringIO()
    for i in range(1, 9):
        progress(i, 8, "weights", out)
    assert out.getvalue().splitlines() == [f"weights: {i}/8" for i in (2, 4, 6, 8)]


def test_bar_on_a_terminal():
    out = _Tty()
    for i in range(1, 4):
        progress(i, 3, "weights", out)
    assert out.getvalue().endswith(f"\rweights [{'#' * 30}] 3/3\n")


def test_flash_mini_writer_reports(tmp_path, capsys):
    from sglang_dsv41.tools.release_checkpoint import main

    assert main(["--preset", "flash-mini", "--out", str(tmp_path / "fm")]) == 0
    err = capsys.readouterr().err
    assert "weights: " in err and "shards written: 2/2" in err
