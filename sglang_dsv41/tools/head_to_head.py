"""Two servers of one checkpoint on one GPU: this package's (`ours`) and stock SGLang's own
(`stock`, the plugin left out with SGLANG_DSV41_PLUGIN=off), with the same flags.

    python -m sglang_dsv41.tools.head_to_head --model-path DIR --side ours|stock
        [--profile marlin] [--port 30000] [--print]       (prints or runs one launch command)

Flags both sides get (`common_flags`): the same --mem-fraction-static, --context-length,
--chunked-prefill-size, --max-running-requests, MoE runner and FP8 GEMM backends (a PROFILE),
--sampling-backend pytorch and --grammar-backend none (neither touches the model's numerics).
What differs is what each side allows: stock SGLang captures decode CUDA graphs (up to batch
64), ours runs with --disable-cuda-graph (the in-tree layer loop with this package's backend is
not verified under capture). Attention, KV pool and page size are each side's own defaults.

A PROFILE names the kernels both sides use where SGLang offers a choice (PROFILES below), so a
machine that lacks one toolchain (the lent H200 has no TileLang) runs the same fallback on both.

`parse_log(text)` reads a server's log for the table: max_total_num_tokens, context length,
running-request cap, memory after the weights and after the KV pool (GiB, SGLang's
`avail mem`), so bytes per token of context = (after weights - after pool) / tokens, each
side's own pool sizing line (ours also states its pool's exact bytes), and which model
served.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sglang_dsv41.plugin_switch import SWITCH_ENV
from sglang_dsv41.tools.node_check import INTREE_LOG  # our CUDA model's start line

SIDES = ("ours", "stock")
OURS_LOG = "sglang_dsv41: DeepseekV41ForCausalLM, roles"  # any model of ours
NO_TILELANG = {
    "SGLANG_OPT_USE_TILELANG_MHC_PRE": "0",
    "SGLANG_OPT_USE_TILELANG_MHC_POST": "0",
    "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0",
}
"""Profile environment: mHC off TileLang (SGLang then runs its torch / Triton mHC paths), and
DeepGEMM's kernels built at first use instead of for every batch size at start (minutes per
server on 16 cores); bench_serving's warm-up request of each point builds that point's."""


@dataclass(frozen=True)
class Profile:
    """Kernel choices both sides share: launch flags and environment."""

    name: str
    flags: tuple
    env: dict = field(default_factory=dict)
    note: str = ""


PROFILES = {
    p.name: p
    for p in (
        Profile(
            "flashinfer",
            ("--moe-runner-backend", "flashinfer_mxfp4"),
            NO_TILELANG,
            "SGLang's SM90 default for packed-FP4 experts (flashinfer CUTLASS W4A16, JIT-built); "
            "FP8 GEMMs on DeepGEMM's block-32 path; mHC on SGLang's Triton kernels",
        ),
        Profile(
            "marlin",
            ("--moe-runner-backend", "marlin"),
            NO_TILELANG,
            "FP4 experts on SGLang's Marlin W4A16 kernel (its own JIT); FP8 GEMMs on DeepGEMM; "
            "mHC on SGLang's Triton kernels; no flashinfer needed",
        ),
        Profile(
            "marlin-triton",
            ("--moe-runner-backend", "marlin", "--fp8-gemm-backend", "triton"),
            {**NO_TILELANG, "SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
            "as marlin, FP8 GEMMs and the mHC pre-GEMM on SGLang's Triton kernels (no DeepGEMM)",
        ),
        Profile("native", (), {}, "SGLang's defaults on every op (TileLang mHC included)"),
    )
}


@dataclass(frozen=True)
class Settings:
    """What both launches share (defaults: the flash-slice on one H200)."""

    mem_fraction_static: float = 0.85
    context_length: int = 1048576
    chunked_prefill_size: int = 8192
    max_running_requests: int = 64
    cuda_graph_max_bs: int = 64
    profile: str = "marlin"


def common_flags(s: Settings) -> list:
    prof = PROFILES[s.profile]
    return [
        "--mem-fraction-static",
        str(s.mem_fraction_static),
        "--context-length",
        str(s.context_length),
        "--chunked-prefill-size",
        str(s.chunked_prefill_size),
        "--max-running-requests",
        str(s.max_running_requests),
        "--sampling-backend",
        "pytorch",
        "--grammar-backend",
        "none",
        "--skip-server-warmup",
        *prof.flags,
    ]


def launch_spec(side: str, model_path: str, port: int, s: Settings, extra=()) -> tuple:
    """(argv, environment changes) of one side's `launch_server`."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), *common_flags(s)]
    if side == "ours":
        argv += ["--disable-cuda-graph"]
        env = {SWITCH_ENV: "on"}
    else:
        argv += ["--cuda-graph-max-bs-decode", str(s.cuda_graph_max_bs)]
        env = {SWITCH_ENV: "off"}
    env.update(PROFILES[s.profile].env)
    return argv + list(extra), env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One launched server: started in its own process group, stopped with it."""

    def __init__(self, side: str, model_path, log: Path, s: Settings, extra=(), env_extra=None):
        self.side, self.log, self.port = side, Path(log), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv, env = launch_spec(side, model_path, self.port, s, extra)
        self.command = " ".join(shlex.quote(a) for a in argv)
        full_env = {**os.environ, **env, **(env_extra or {})}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as f:
            f.write(f"+ {' '.join(f'{k}={v}' for k, v in env.items())} {self.command}\n")
            f.flush()
            self.proc = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
            )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health answers 200; raises with the log's tail if it never does."""
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.side} server exited ({self.proc.returncode}):\n" + self.tail()
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - t0
            except OSError:
                pass
            if time.time() - t0 > timeout:
                raise RuntimeError(
                    f"{self.side} server not ready after {timeout:.0f} s:\n" + self.tail()
                )
            time.sleep(2)

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def post_json(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


_PATTERNS = {
    "max_total_num_tokens": (r"max_total_num_tokens=(\d+)", int),
    "context_len": (r"context_len=(\d+)", int),
    "max_running_requests": (r"max_running_requests=(\d+)", int),
    "weights_gib": (r"Load weight end\..*?mem usage=([\d.]+) GB", float),
    "avail_after_weights_gib": (r"Load weight end\..*?avail mem=([\d.]+) GB", float),
    "avail_after_pool_gib": (r"Memory pool end\. avail mem=([\d.]+) GB", float),
    "ours_pool_budget_gib": (r"dsv41 pool sizing: ([\d.]+) GiB budget", float),
    "ours_global_bytes_per_token": (r"dsv41 pool sizing: .*? full slots x ([\d.]+) B", float),
    "ours_pool_bytes": (r"dsv41 KV pool: .*?GiB allocated \((\d+) B\)", int),
    "stock_pool_full": (r"DSV4 pool sizes: full=(\d+)", int),
    "stock_pool_swa": (r"DSV4 pool sizes: full=\d+, swa=(\d+)", int),
}


def parse_log(text: str) -> dict:
    """The figures of one server log (None where a line is missing); see the module docstring."""
    out = {}
    for key, (pattern, cast) in _PATTERNS.items():
        m = re.findall(pattern, text)
        out[key] = cast(m[-1]) if m else None
    kv = None
    if out["avail_after_weights_gib"] is not None and out["avail_after_pool_gib"] is not None:
        kv = (out["avail_after_weights_gib"] - out["avail_after_pool_gib"]) * 2**30
    out["kv_pool_bytes"] = kv
    tokens = out["max_total_num_tokens"]
    out["kv_bytes_per_token"] = kv / tokens if kv and tokens else None
    limits = [v for v in (out["context_len"], tokens) if v]
    out["longest_context"] = min(limits) if limits else None
    ours = INTREE_LOG in text or OURS_LOG in text
    out["served_by"] = "ours" if ours else ("stock" if "plugin left out" in text else None)
    out["ours_cuda_model"] = INTREE_LOG in text
    out["cuda_graphs"] = "--disable-cuda-graph" not in text.splitlines()[0] if text else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.head_to_head", description=__doc__
    )
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--side", choices=SIDES, required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), default=Settings.profile)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--print", action="store_true", help="print the command, do not run it")
    a, extra = ap.parse_known_args(argv)
    argv_, env = launch_spec(a.side, a.model_path, a.port, Settings(profile=a.profile), extra)
    line = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(argv_)
    if a.print:
        print(line)
        return 0
    return subprocess.call(argv_, env={**os.environ, **env})


if __name__ == "__main__":
    sys.exit(main())
