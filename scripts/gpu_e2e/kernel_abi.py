"""sglang-kernel's Python wrappers against the op library actually loaded (lent GPU machine only).

The device runs sglang-kernel 0.4.10's Python package over 0.4.5's `sm90/common_ops.abi3.so`, a
torch-2.11 build of the same Hopper op library (prepare.sh --kernels). This script lists every
`torch.ops.sgl_kernel.NAME(...)` call in the wrappers, with the number of positional arguments
it passes, and compares it with the schema that the loaded library registered for NAME:

    missing   the wrapper calls an op the library does not register
    arity     the call passes fewer arguments than the schema requires or more than it takes

With census folders (preload/op_census.py), it says which of those wrappers SGLang called:

    python kernel_abi.py [--json OUT] [CENSUS_DIR ...]

`wrapper_calls(package_dir)` and `compare(calls, schemas)` are plain functions of files and
dicts; tests/cpu/test_gpu_e2e_kernel_abi.py holds them to synthetic wrappers.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class OpCall:
    wrapper: str  # "sgl_kernel.elementwise.rmsnorm": module.function that makes the call
    op: str  # the op's name under torch.ops.sgl_kernel
    nargs: int  # positional + keyword arguments passed (a *args call counts as -1)


@dataclass(frozen=True)
class Schema:
    required: int  # arguments without a default
    total: int  # all arguments


@dataclass(frozen=True)
class Difference:
    call: OpCall
    kind: str  # "missing" | "arity"
    schema: str  # what the library registers ("" when missing)


def _op_name(func: ast.expr) -> str | None:
    """NAME of `torch.ops.sgl_kernel.NAME(...)` or `torch.ops.sgl_kernel.NAME.default(...)`."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(func.id)
    parts.reverse()  # torch, ops, sgl_kernel, NAME[, overload]
    if parts[:3] != ["torch", "ops", "sgl_kernel"] or len(parts) < 4:
        return None
    return parts[3]


def wrapper_calls(package_dir: Path, package: str = "sgl_kernel") -> list[OpCall]:
    """Every op call in the package's Python files, by the function that makes it."""
    out = []
    for path in sorted(Path(package_dir).rglob("*.py")):
        rel = path.relative_to(package_dir).with_suffix("")
        parts = [package, *rel.parts]
        if parts[-1] == "__init__":
            parts.pop()
        module = ".".join(parts)
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and (op := _op_name(node.func)):
                    starred = any(isinstance(a, ast.Starred) for a in node.args)
                    n = -1 if starred else len(node.args) + len(node.keywords)
                    out.append(OpCall(f"{module}.{fn.name}", op, n))
    return sorted(set(out), key=lambda c: (c.wrapper, c.op, c.nargs))


def compare(calls: list[OpCall], schemas: dict[str, Schema], texts: dict | None = None):
    """The calls whose op is missing or whose argument count the schema does not take."""
    texts = texts or {}
    diffs = []
    for c in calls:
        s = schemas.get(c.op)
        if s is None:
            diffs.append(Difference(c, "missing", ""))
        elif c.nargs >= 0 and not s.required <= c.nargs <= s.total:
            diffs.append(Difference(c, "arity", texts.get(c.op, "")))
    return diffs


def loaded_schemas(names) -> tuple[dict[str, Schema], dict[str, str]]:
    """The default overload's schema of each op the imported library registers."""
    import torch

    schemas, texts = {}, {}
    for name in sorted(set(names)):
        if not hasattr(torch.ops.sgl_kernel, name):
            continue
        packet = getattr(torch.ops.sgl_kernel, name)
        overload = packet.default if "default" in packet.overloads() else None
        if overload is None:
            overload = getattr(packet, packet.overloads()[0])
        args = overload._schema.arguments
        schemas[name] = Schema(sum(a.default_value is None for a in args), len(args))
        texts[name] = str(overload._schema)
    return schemas, texts


def census_calls(dirs) -> set[str]:
    sys.path.insert(0, str(Path(__file__).parent / "preload"))
    import op_census

    seen = set()
    for d in dirs:
        if Path(d).is_dir():
            seen |= set(op_census.merge(str(d)))
    return seen


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = None
    if args[:1] == ["--json"]:
        out, args = Path(args[1]), args[2:]
    import sgl_kernel

    pkg = Path(sgl_kernel.__file__).parent
    calls = wrapper_calls(pkg)
    schemas, texts = loaded_schemas(c.op for c in calls)
    diffs = compare(calls, schemas, texts)
    reached = census_calls(args)
    lib = getattr(sgl_kernel, "common_ops", None)
    print(f"kernel_abi: {len(calls)} op calls in {pkg}, library {getattr(lib, '__file__', '?')}")
    print(f"kernel_abi: {len(set(schemas))} of {len({c.op for c in calls})} ops registered")
    for d in diffs:
        hit = "REACHED" if d.call.wrapper in reached else "not reached" if args else ""
        print(f"kernel_abi: {d.kind:7s} {d.call.wrapper} -> {d.call.op}({d.call.nargs}) {hit}")
        if d.schema:
            print(f"kernel_abi:         library: {d.schema}")
    bad = [d for d in diffs if d.call.wrapper in reached]
    if args:
        print(f"kernel_abi: {len(bad)} differences on wrappers SGLang called")
    if out:
        out.write_text(
            json.dumps(
                {
                    "differences": [asdict(d) for d in diffs],
                    "reached": sorted(d.call.wrapper for d in bad),
                },
                indent=1,
            )
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
