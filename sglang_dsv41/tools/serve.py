"""Serve a V4.1 checkpoint with stock SGLang; with no --model-path, the embedded retrieval model.

    python -m sglang_dsv41.tools.serve [--model-path DIR] [any sglang.launch_server argument]

Without --model-path it serves the trained retrieval model shipped in the package
(`sglang_dsv41/data/retrieval`, docs/retrieval_model.md); `--model-path tiny` serves the random
tiny preset, written once to $DSV41_MODELS (default ~/.cache/sglang-dsv41/models)/tiny by
`tools.make_checkpoint`. Without
CUDA, `--device cpu` is added, and `--sleep-on-idle` (SGLang's scheduler otherwise polls a core
while idle). Then this process becomes `python -m sglang.launch_server ...`: the plugin entry
point does the rest (docs/serving.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RETRIEVAL_DIR = Path(__file__).resolve().parent.parent / "data" / "retrieval"
"""The trained retrieval checkpoint shipped in the package (config, weights, tokenizer)."""
TINY = "tiny"
"""--model-path value that names the random tiny preset."""


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


def default_model() -> str:
    """The checkpoint served without --model-path: the shipped retrieval model."""
    if not (RETRIEVAL_DIR / "config.json").is_file():
        raise FileNotFoundError(f"the retrieval checkpoint is missing from {RETRIEVAL_DIR}")
    return str(RETRIEVAL_DIR)


def _resolve(path: str) -> str:
    return ensure_tiny() if path == TINY else path


def _model_arg(args: list) -> list:
    """args with --model-path set: the default when absent, the tiny checkpoint for `tiny`."""
    for i, a in enumerate(args):
        if a == "--model-path" and i + 1 < len(args):
            return args[: i + 1] + [_resolve(args[i + 1])] + args[i + 2 :]
        if a.startswith("--model-path="):
            return args[:i] + ["--model-path=" + _resolve(a.split("=", 1)[1])] + args[i + 1 :]
    return ["--model-path", default_model()] + args


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def build_command(argv: list) -> list:
    args = _model_arg(list(argv))
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
