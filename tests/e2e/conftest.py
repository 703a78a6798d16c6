"""End-to-end fixtures: one tiny checkpoint per session, one server per configuration (module
scope), and the reference's greedy outputs (computed once per prompt and replay mode)."""

from __future__ import annotations

import os

import pytest
import torch
from e2e.server import Server

from sglang_dsv41.tools.serve import write_checkpoint

MAX_NEW = 6


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    return write_checkpoint(out, capture_output=True, timeout=300)


def prompt_set(vocab: int, seed: int = 1234) -> list:
    """20 prompts: lengths around and far beyond the tiny model's window (16), top-k (8
    entries = 16 tokens at ratio 2) and candidate pool (12 blocks x 4 = 48 positions)."""
    lengths = [1, 2, 3, 8, 15, 16, 17, 31, 33, 48, 49, 64, 97, 128, 150, 201, 256, 300, 333, 400]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


class Oracle:
    def __init__(self, path: str):
        from sglang_dsv41.reference import load_reference

        self.model = load_reference(path)
        self.vocab = self.model.cfg.vocab_size
        self._done = {}

    def generate(self, ids, n: int = MAX_NEW, replay: bool = False, resumes=()) -> list:
        """Greedy tokens; resumes: the prefix resume points the server served the prompt with
        (docs/design.md 2.8)."""
        key = (tuple(ids), n, replay, tuple(resumes))
        if key not in self._done:
            self._done[key] = self.model.generate(list(ids), n, replay=replay, resumes=resumes)
        return list(self._done[key])


@pytest.fixture(scope="session")
def oracle(tiny_dir):
    return Oracle(tiny_dir)


@pytest.fixture(scope="session")
def prompts(oracle):
    return prompt_set(oracle.vocab)


REPLAY_LINE = "dsv41 prefix replay: a hit of {} cached tokens"


def resumes_of(server, before: str, cached: int) -> tuple:
    """(cached,) when the server's log gained a prefix replay of `cached` tokens since it read
    `before` (a request served from a hit whose SWA was gone), else () (an exact hit)."""
    line = REPLAY_LINE.format(cached)
    return (cached,) if server.log().count(line) > before.count(line) else ()


def oracle_tokens(oracle, server, before: str, ids, n: int, cached: int) -> list:
    """The oracle's greedy tokens (decoder replay on) for a request the server answered with
    `cached` prompt tokens from its cache since its log read `before`: resumed at `cached` when
    the server served the hit by prefix replay (its SWA was gone), the plain forward otherwise."""
    return oracle.generate(ids, n, replay=True, resumes=resumes_of(server, before, cached))


# SGLang's own test switch: retract running decode requests every 3 forwards (they are freed
# and re-prefilled later, through the radix cache), so retraction runs under real traffic.
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1"}
RETRACTED = r"Testing retraction\. #retracted_reqs: [1-9]"


def start_server(tmp_path_factory, tiny_dir, name: str, *args, env=None) -> Server:
    log = tmp_path_factory.mktemp("logs") / f"{name}.log"
    return Server(tiny_dir, str(log), args, env)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_dir):
    """The tiny model's server as the test module declares it: `SERVER = (name, args, env)`."""
    name, args, env = request.module.SERVER
    s = start_server(tmp_path_factory, tiny_dir, name, *args, env=env)
    yield s
    s.stop()


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
