"""Filler text for the retrieval task: two English sources that ship with every CPython.

    topics      (training)  `pydoc_data.topics`: the Python Language Reference as plain text,
                            ~465 KB, in every CPython install (what `help("assignment")` prints).
    docstrings  (held out)  the docstrings of the standard library's top-level modules (their
                            source files read with `ast`, nothing imported): ~1 MB of a different
                            register (API prose rather than language reference).

Both are wrapped into `FillerLine`s of plain ASCII prose: paragraphs are re-flowed and wrapped at
word boundaries to lines of LINE_MIN..LINE_MAX characters; grammar blocks and code (indented
lines), lines with runs of four or more digits and lines that say "code of" are dropped, so that
no filler line can be mistaken for a fact or answer one. The sources depend only on the Python
version (3.11.7 in the shared environment): the same version gives the same lines.
"""

from __future__ import annotations

import ast
import re
import sysconfig
import textwrap
from functools import cache
from pathlib import Path

LINE_MIN, LINE_MAX = 24, 96
SOURCES = ("topics", "docstrings")
TRAIN_SOURCE, HELD_OUT_SOURCE = SOURCES
_BANNED = re.compile(r"code of|\d{4}", re.IGNORECASE)
_RULE = re.compile(r"^[*=\-~^#+]{3,}$")


def paragraphs_to_lines(text: str) -> list:
    """Plain text -> wrapped prose lines (see module docstring for what is dropped)."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        rows = [r for r in para.split("\n") if r.strip()]
        if not rows or any(r.startswith((" ", "\t", ">>>")) for r in rows):
            continue  # code, grammar productions, doctests, indented lists
        flat = " ".join(r.strip() for r in rows if not _RULE.match(r.strip()))
        flat = flat.encode("ascii", "ignore").decode()
        if len(flat) < LINE_MIN or not re.search(r"[a-z]{3}", flat):
            continue
        for line in textwrap.wrap(flat, LINE_MAX, break_long_words=False):
            if len(line) >= LINE_MIN and not _BANNED.search(line):
                out.append(line)
    return out


def topics_text() -> str:
    import pydoc_data.topics

    return "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))


def docstrings_text() -> str:
    """Module, class and function docstrings of the stdlib's top-level *.py files, file order
    sorted, nodes in source order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    return "\n\n".join(parts)


@cache
def filler_lines(source: str) -> tuple:
    """The wrapped prose lines of `source` ("topics" or "docstrings"), a tuple of str."""
    if source == "topics":
        text = topics_text()
    elif source == "docstrings":
        text = docstrings_text()
    else:
        raise ValueError(f"filler source {source!r}: one of {SOURCES}")
    lines = paragraphs_to_lines(text)
    if not lines:
        raise RuntimeError(f"filler source {source!r} produced no lines")
    return tuple(lines)
