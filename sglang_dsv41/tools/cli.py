"""The command lines' shared argument parser."""

from __future__ import annotations

import argparse


def cli_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of `python -m <module>`, with `doc` (the module's docstring) as its description,
    laid out as written."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
