"""The core (everything but sglang_dsv41/sglang) must import without SGLang: the GPU machine has
none. Each module is imported in a fresh interpreter with `sys.modules["sglang"] = None`."""

import pkgutil
import subprocess
import sys

import sglang_dsv41
import sglang_dsv41.kernels


def _core_modules():
    mods = []
    for pkg in (sglang_dsv41, sglang_dsv41.kernels):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            name = info.name
            if name.startswith("sglang_dsv41.sglang") or name.endswith("__main__"):
                continue
            mods.append(name)
    return mods


def test_core_imports_without_sglang():
    mods = _core_modules()
    assert "sglang_dsv41.reference.model" in mods and "sglang_dsv41.kv.records" in mods
    assert "sglang_dsv41.serving.attention" in mods and "sglang_dsv41.serving.toy" in mods
    code = (
        "import sys, importlib\nsys.modules['sglang'] = None\n"
        f"for m in {mods!r}:\n    importlib.import_module(m)\n"
        "assert 'sglang.srt' not in sys.modules\n"
        "up = [m for m in sys.modules if m.startswith('sglang_dsv41.sglang')]\n"
        "assert not up, up  # the core never imports the glue\n"
        "print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
