"""Decode CUDA graphs of the CUDA model (SGLang's in-tree V4 skeleton with the dsv41 attention)
against eager decode, through `launch_server` on one GPU (docs/speculative.md 5).

Not yet run: written while no GPU was available. It is what must pass before
`cuda_defaults.INTREE_DECODE_GRAPHS_VERIFIED` is set True; until then each graph server is
launched with that value flipped in the launcher process only (the flag check runs at argument
resolution there).

Two servers on the same released-format checkpoint (`DSV41_FLASH_SLICE=DIR`, the flash-slice;
skipped without it), one with `--disable-cuda-graph` (eager decode), one with decode graphs on
and `--disable-prefill-cuda-graph`, serve the same traffic: waves of requests submitted
together, with different prompt lengths and output lengths, so requests join (prefill, eager on
both) and leave, and decode batch sizes fall between the captured ones (padded on the graph
server). Greedy tokens and their logprobs must be equal bit for bit, with decoder SWA bounded
replay on and off. Eager decode's own host syncs are covered by tests/gpu/test_decode_graphs.py
(the same backend path); a host sync inside a capture fails the graph server's startup.

If logprobs differ only in the last bits while tokens agree, check whether SGLang's FP8 GEMMs
give different roundings for the padded batch (run the eager server with
`--cuda-graph-bs` sizes equal to the traffic's batch sizes) before suspecting the backend.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(not os.environ.get("DSV41_FLASH_SLICE"), reason="DSV41_FLASH_SLICE unset"),
]
pytest.importorskip("sglang")

MAX_BS = 8
WAVES = [[(37, 24), (5, 9), (120, 17)], [(64, 30), (9, 4), (300, 21), (18, 12), (2, 28)], [(77, 6)]]
LAUNCH = (
    "import runpy, sys\n"
    "import sglang_dsv41.sglang.cuda_defaults as d\n"
    "d.INTREE_DECODE_GRAPHS_VERIFIED = True\n"
    "sys.argv[0] = 'sglang.launch_server'\n"
    "runpy.run_module('sglang.launch_server', run_name='__main__')\n"
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GpuServer:
    def __init__(self, model: str, graphs: bool, replay: bool, log_path: str):
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["--model-path", model, "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--cuda-graph-max-bs-decode", str(MAX_BS), "--mem-fraction-static", "0.6"]
        args += ["--disable-prefill-cuda-graph"] if graphs else ["--disable-cuda-graph"]
        if not replay:
            args.append("--no-enable-decoder-swa-bounded-replay")
        cmd = [sys.executable, "-c", LAUNCH, *args]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 900
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {open(log_path).read()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        self.stop()
        raise TimeoutError("server not ready")

    def generate(self, ids, n):
        body = {
            "input_ids": ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        }
        req = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
        meta = out["meta_info"]
        return [(t[1], t[0]) for t in meta["output_token_logprobs"]]  # (token, logprob)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def _traffic(server, vocab: int):
    g = torch.Generator().manual_seed(7)
    results = {}
    for w, wave in enumerate(WAVES):
        threads = []
        for k, (n_prompt, n_new) in enumerate(wave):
            ids = torch.randint(2, vocab, (n_prompt,), generator=g).tolist()

            def run(key=(w, k), ids=ids, n=n_new):
                results[key] = server.generate(ids, n)

            threads.append(threading.Thread(target=run))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return results


@pytest.mark.parametrize("replay", [True, False])
def test_decode_graphs_equal_eager(replay, tmp_path):
    model = os.environ["DSV41_FLASH_SLICE"]
    cfg = json.load(open(os.path.join(model, "config.json")))
    vocab = cfg.get("text_config", cfg)["vocab_size"]
    out = {}
    for graphs in (False, True):
        server = GpuServer(model, graphs, replay, str(tmp_path / f"server_{graphs}.log"))
        try:
            out[graphs] = _traffic(server, vocab)
        finally:
            server.stop()
        log = (tmp_path / f"server_{graphs}.log").read_text()
        if graphs:
            assert "prefill runs eager" in log and "Capture target decode CUDA graph end" in log
    eager, graph = out[False], out[True]
    assert eager.keys() == graph.keys()
    for key in eager:
        assert [t for t, _ in eager[key]] == [t for t, _ in graph[key]], key
        assert [lp for _, lp in eager[key]] == [lp for _, lp in graph[key]], key
