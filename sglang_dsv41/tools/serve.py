"""Serve a V4.1 checkpoint with stock SGLang; with no --model-path, the embedded tiny model.

    python -m sglang_dsv41.tools.serve [--model-path DIR] [any sglang.launch_server argument]

Without --model-path the tiny preset checkpoint is written once to
$DSV41_MODELS (default ~/.cache/sglang-dsv41/models)/tiny by `tools.make_checkpoint`. Without
CUDA, `--device cpu` is added, and `--sleep-on-idle` (SGLang's scheduler otherwise polls a core
while idle). Then this process becomes `python -m sglang.launch_server ...`: the plugin entry
point does the rest (docs/serving.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def models_dir() -> Path:
    return Path(os.environ.get("DSV41_MODELS", Path.home() / ".cache" / "sglang-dsv41" / "models"))


def write_checkpoint(
    out, preset: str = "tiny", tool: str = "make_checkpoint", force: bool = False, **run_kw
) -> str:
    """`python -m sglang_dsv41.tools.<tool> --preset <preset> --out <out> [--force]` in a
    subprocess (check=True; `run_kw` go to subprocess.run); returns `out` as a string."""
    cmd = [sys.executable, "-m", f"sglang_dsv41.tools.{tool}", "--preset", preset]
    subprocess.run(cmd + ["--out", str(out)] + (["--force"] if force else []), check=True, **run_kw)
    return str(out)


def ensure_tiny() -> str:
    out = models_dir() / "tiny"
    if not (out / "config.json").exists() or not any(out.glob("*.safetensors")):
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"[serve] creating the tiny checkpoint in {out}", file=sys.stderr)
        write_checkpoint(out, force=True)
    return str(out)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def build_command(argv: list) -> list:
    args = list(argv)
    if "--model-path" not in args and not any(a.startswith("--model-path=") for a in args):
        args = ["--model-path", ensure_tiny()] + args
    if not any(a == "--device" or a.startswith("--device=") for a in args) and not _has_cuda():
        args += ["--device", "cpu"]
    if (
        "--device" in args
        and args[args.index("--device") + 1] == "cpu"
        and "--sleep-on-idle" not in args
    ):
        args.append("--sleep-on-idle")
    return [sys.executable, "-m", "sglang.launch_server"] + args


def main(argv=None) -> int:
    from sglang_dsv41.sglang.access import redact_argv

    cmd = build_command(sys.argv[1:] if argv is None else argv)
    print("[serve] " + " ".join(redact_argv(cmd)), file=sys.stderr)
    os.execv(cmd[0], cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
