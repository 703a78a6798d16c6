"""GPU node check: serve flash-mini with stock SGLang at --tp 1 and 2, compare with the oracle.

    python -m sglang_dsv41.tools.node_check [--work DIR] [--tp 1,2] [--new 12]
                                            [--server-args "--mem-fraction-static 0.5"]
(`scripts/gpu_node_check.sh` runs it.) Steps:
  1. writes the released-format flash-mini checkpoint (`tools.release_checkpoint`) at hidden
     and expert widths of 256 (NODE_WIDTHS);
  2. the CPU oracle (`reference`, fp32, decoder replay as served) with the activation-
     quantization switch on (`reference.act_quant`: the inputs of the FP8 linears quantized the
     way SGLang's FP8 linears quantize them) and the attention's queries and output rounded as
     the server runs them (bf16 unless SGLANG_DSV41_ATTN_DTYPE=fp32; `set_attention_dtype`)
     generates greedy tokens for fixed prompts of 1-131 tokens (flash-mini: window 16, top-k 8,
     candidate pool 6 blocks x 4), and records its log-probabilities along its own trajectory;
  3. for each TP size the node has GPUs for: `python -m sglang.launch_server --model-path CKPT
     --tp N` (nothing else), checks the log says the in-tree CUDA skeleton served, sends the
     prompts to /generate (greedy, no logprobs: asking for them changes the replay floor);
  4. per prompt: equal, or diverged at a near-tie: at the first differing step the oracle
     prefers its token over the served one by at most TOL_NATS (0.25 nats). Anything else fails.
The tolerance covers what the switches do not model: the served model runs in bf16 (weights and
activations; the oracle in fp32), the attention kernels round their probabilities to bf16 and
sum in another order, and the routed experts run on flashinfer's MXFP4 kernels. Prints
per-prompt lines and one verdict line:
    gpu_node_check: PASS tp=1 6/6 (5 equal, 1 near-tie), tp=2 ...      or   ... FAIL ...
Exit status 0 on PASS, 1 on FAIL, 2 when nothing could be served.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT_LENS = (1, 5, 20, 41, 66, 131)
NODE_WIDTHS = {"hidden_size": 256, "moe_intermediate_size": 256}
"""flash-mini at hidden 256 and expert width 256: SGLang's FP4 MoE runner on SM90 (flashinfer
CUTLASS, W4A16) needs the hidden size and the per-rank expert width to be multiples of 128
(flash-mini's 64 are not), at TP 2 too."""
TOL_NATS = 0.25
INTREE_LOG = "in-tree DeepseekV4 skeleton with dsv41 attention"


def prompts(vocab: int, seed: int = 1234) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in PROMPT_LENS]


def oracle(ckpt: str, ps: list, new: int, attn_dtype=None) -> list:
    """Per prompt: (greedy tokens, log-probs fp64 [new, vocab] along them), switch on; the
    attention's queries and output rounded to attn_dtype (the server's mode) when not None."""
    import torch

    from sglang_dsv41.layers.attention import set_attention_dtype
    from sglang_dsv41.reference import load_reference
    from sglang_dsv41.reference.act_quant import quantize_fp8_linear_inputs

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    model = load_reference(ckpt, torch.float32)
    quantize_fp8_linear_inputs(model)
    set_attention_dtype(model, attn_dtype)
    out = []
    for p in ps:
        floor = model.replay_floor_for(len(p), True)
        ids, toks, lps = list(p), [], []
        with torch.no_grad():
            for _ in range(new):
                logits = model.forward(torch.tensor(ids), replay_floor=floor)[-1]
                lp = torch.log_softmax(logits.double(), -1)
                t = int(lp.argmax())
                toks.append(t)
                lps.append(lp)
                ids.append(t)
        out.append((toks, lps))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(ckpt: str, tp: int, ps: list, new: int, log: Path, extra: list, timeout: float):
    """Launch the stock server, generate greedily for every prompt, stop it. Returns the outputs
    and whether the log shows the in-tree CUDA model."""
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", ckpt, "--tp", str(tp)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--disable-cuda-graph", *extra]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"server not ready after {timeout:.0f} s; see {log}")
            time.sleep(2)
        outs = []
        for p in ps:
            body = {
                "input_ids": p,
                "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True},
            }
            req = urllib.request.Request(
                url + "/generate",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                outs.append(json.loads(r.read())["output_ids"])
        return outs, INTREE_LOG in log.read_text(errors="replace")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def judge(want: list, lps: list, got: list) -> tuple:
    """('equal' | 'near-tie' | 'diverged', first differing step or None, oracle margin)."""
    for k, (w, g) in enumerate(zip(want, got, strict=False)):
        if w != g:
            margin = float(lps[k][w] - lps[k][g])
            return ("near-tie" if margin <= TOL_NATS else "diverged"), k, margin
    if len(got) != len(want):
        return "diverged", min(len(got), len(want)), float("inf")
    return "equal", None, 0.0


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.node_check", description=__doc__
    )
    ap.add_argument("--work", default=None, help="working directory (default: a temp dir)")
    ap.add_argument("--tp", default="1,2", help="TP sizes to serve (those with enough GPUs)")
    ap.add_argument("--new", type=int, default=12, help="greedy tokens per prompt")
    ap.add_argument("--server-args", default="", help="extra launch_server arguments")
    ap.add_argument("--start-timeout", type=float, default=1200)
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="dsv41_node_"))
    work.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    sizes = [int(t) for t in a.tp.split(",") if t.strip()]
    missing = [tp for tp in sizes if tp > gpus]
    results = {}
    if len(missing) < len(sizes):
        from sglang_dsv41.sglang import options
        from sglang_dsv41.tools.release_checkpoint import write_flash_mini

        ckpt = str(write_flash_mini(work / "flash-mini-256", force=True, widths=NODE_WIDTHS))
        cfg = json.loads((Path(ckpt) / "config.json").read_text())
        ps = prompts(cfg["text_config"]["vocab_size"])
        mode = options.attn_dtype(options.INTREE_ATTN_DEFAULT)  # as the server resolves it
        print(
            f"checkpoint {ckpt}; oracle (CPU, fp32, activation quantization on, attention "
            f"queries and output {options.attn_mode_name(mode)}) ...",
            flush=True,
        )
        ref = oracle(ckpt, ps, a.new, mode)
    for tp in sizes:
        if tp in missing:
            continue
        log = work / f"server_tp{tp}.log"
        try:
            outs, intree = serve(
                ckpt, tp, ps, a.new, log, shlex.split(a.server_args), a.start_timeout
            )
        except Exception as e:  # report and go on: one verdict line at the end
            print(f"tp={tp}: {e}", flush=True)
            results[tp] = None
            continue
        rows = []
        for p, (want, lps), got in zip(ps, ref, outs, strict=True):
            kind, step, margin = judge(want, lps, got)
            rows.append(kind)
            detail = "" if step is None else f" at step {step}, oracle margin {margin:.3f} nats"
            print(f"tp={tp} len {len(p):4d}: {kind}{detail}", flush=True)
        results[tp] = (rows, intree)
    parts, ok, served = [], True, False
    for tp, r in results.items():
        if r is None:
            parts.append(f"tp={tp} not served")
            ok = False
            continue
        served = True
        rows, intree = r
        eq, tie = rows.count("equal"), rows.count("near-tie")
        good = eq + tie == len(rows) and intree
        ok &= good
        note = "" if intree else ", in-tree model NOT used"
        parts.append(f"tp={tp} {eq + tie}/{len(rows)} ({eq} equal, {tie} near-tie{note})")
    parts += [f"tp={tp} skipped ({gpus} GPUs)" for tp in missing]
    verdict = "PASS" if ok and served else "FAIL"
    print(f"gpu_node_check: {verdict} " + ", ".join(parts) + f" (tolerance {TOL_NATS} nats)")
    return 0 if verdict == "PASS" else (2 if not served else 1)


if __name__ == "__main__":
    sys.exit(main())
