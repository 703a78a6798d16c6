"""The package's import layers, read from the source with `ast` (every import counts: module
level, inside functions, under TYPE_CHECKING):

- sglang/ holds only modules that import sglang or transformers; a pure rule belongs outside it;
- outside sglang/ and tools/ no module imports sglang or the glue, not even lazily;
- no two modules of the package import each other: in a pair, one stands on the other.
test_core_imports.py checks the first two at run time, this file also sees the imports a run
never reaches."""

import ast
from pathlib import Path

import pytest

import sglang_dsv41
import sglang_dsv41.kernels

PKG = "sglang_dsv41"
ROOTS = {
    PKG: Path(sglang_dsv41.__file__).parent,
    f"{PKG}.kernels": Path(sglang_dsv41.kernels.__file__).parent,
}


def _modules() -> dict:
    """Dotted name -> (path, is a package __init__) for every module of the package."""
    out = {}
    for name, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            init = parts[-1] == "__init__"
            out[".".join(parts[:-1] if init else parts)] = (path, init)
    return out


MODULES = _modules()


def _imported(name: str) -> set:
    """Every dotted name the module imports: `import a.b` gives a.b, `from a import b` gives a
    and a.b (b may be a submodule); relative imports resolved against the module's package."""
    path, init = MODULES[name]
    package = name.split(".") if init else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


IMPORTS = {name: _imported(name) for name in MODULES}


def _stands_on(a: str, b: str) -> bool:
    return f"{PKG}.{b}" in IMPORTS[f"{PKG}.{a}"]


def test_the_walk_sees_the_package():
    assert f"{PKG}.config" in MODULES and f"{PKG}.kernels.args" in MODULES
    assert f"{PKG}.kernels.sparse_attn.cuda_decode" in IMPORTS[f"{PKG}.kernels.sparse_attn.triton"]


@pytest.mark.parametrize(
    "upper, lower",
    [
        ("config", "config_checks"),
        ("serving.stores", "serving.context"),
        ("tools.flash_slice", "tools.slice_weights"),
        ("tools.recall_report", "tools.recall_plot"),
    ],
    ids=lambda v: v.rsplit(".", 1)[-1],
)
def test_one_file_stands_on_the_other(upper, lower):
    assert _stands_on(upper, lower), f"{upper} no longer imports {lower}: update this test"
    assert not _stands_on(lower, upper), f"{lower} imports {upper}, which stands on it"


def test_no_two_modules_import_each_other():
    """kernels/ is left out: the dispatcher and the indexer's SM100 path still import each
    other there."""
    names = [n for n in MODULES if not n.startswith(f"{PKG}.kernels")]
    both = sorted(
        (a, b) for a in names for b in names if a < b and b in IMPORTS[a] and a in IMPORTS[b]
    )
    assert not both, both


def test_dspark_defaults_is_a_pure_rule():
    assert f"{PKG}.dspark_defaults" in MODULES
    assert f"{PKG}.sglang.dspark_defaults" not in MODULES
    assert f"{PKG}.dspark_defaults" in IMPORTS[f"{PKG}.sglang.server_defaults"]


def test_sglang_folder_holds_only_what_imports_sglang():
    lone = []
    for name, (_, init) in MODULES.items():
        if name.startswith(f"{PKG}.sglang.") and not init:
            tops = {m.split(".")[0] for m in IMPORTS[name]}
            if not tops & {"sglang", "transformers"}:
                lone.append(name)
    assert not lone, f"import neither sglang nor transformers: move them out of sglang/: {lone}"


def test_core_never_imports_sglang():
    glue = []
    for name in MODULES:
        if name.startswith((f"{PKG}.sglang", f"{PKG}.tools")):
            continue
        hits = {m for m in IMPORTS[name] if m.split(".")[0] == "sglang"}
        hits |= {m for m in IMPORTS[name] if m == f"{PKG}.sglang" or m.startswith(f"{PKG}.sglang.")}
        if hits:
            glue.append((name, sorted(hits)))
    assert not glue, glue
