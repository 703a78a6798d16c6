"""Start `python -m sglang.launch_server` on loopback as a subprocess, bounded in time.

The server runs in its own process group; `stop()` ends that group (the launcher and every
SGLang child it spawned) and nothing else. Its output goes to a log file the tests read (to
check which classes served).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

START_TIMEOUT_S = float(os.environ.get("DSV41_E2E_START_TIMEOUT", "300"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body, timeout: float = 120.0, raw: bool = False):
    """POST JSON (or raw bytes) -> (status, parsed JSON or text)."""
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def post_stream(url: str, body, timeout: float = 120.0) -> list:
    """POST with stream=true -> list of parsed `data:` events (without [DONE])."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:"):
                payload = line[5:].strip()
                if payload and payload != "[DONE]":
                    events.append(json.loads(payload))
    return events


class Server:
    def __init__(self, model_dir: str, log_path: str, args=(), env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model_dir,
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--sleep-on-idle",
            *args,
        ]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200 and "fired up" in self.log():
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"server not ready in {START_TIMEOUT_S}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def generate(self, input_ids, max_new_tokens: int, timeout: float = 120.0, **extra):
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0,
                "ignore_eos": True,
                **extra,
            },
        }
        status, out = post(self.url + "/generate", body, timeout=timeout)
        assert status == 200, (status, out)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        self._log.close()
