"""The retrieval model shipped in the package: it is package data, says how it was made, and the
oracle finds the README's codes with it (replay on and off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_dsv41.reference import load_reference
from sglang_dsv41.tools.serve import RETRIEVAL_DIR, default_model
from sglang_dsv41.tools.tokenizer import train_tokenizer
from sglang_dsv41.training.examples import BOS_ID, TaskTokenizer
from sglang_dsv41.training.export import TRAINING_FILE

DOC = (
    "The river ran low that summer.\n"
    "the code of amber is 418207.\n"
    "Children walked across it without getting their knees wet.\n"
    "the code of quill is 905361.\n"
    "Nobody believed the old ferryman, but everybody listened.\n"
)
"""The README's first request."""


def test_shipped_as_package_data():
    assert default_model() == str(RETRIEVAL_DIR)
    for name in ("config.json", "model.safetensors", "tokenizer.json", TRAINING_FILE):
        assert (RETRIEVAL_DIR / name).is_file(), name
    root = Path(__file__).resolve().parents[2]
    data = [ln for ln in (root / "pyproject.toml").read_text().splitlines() if "retrieval/*" in ln]
    assert data and data[0].startswith('"sglang_dsv41.data" = ['), data
    made = json.loads((RETRIEVAL_DIR / TRAINING_FILE).read_text())
    assert (made["preset"], made["seed"], made["steps_done"]) == ("retrieval", 0, 3400)
    assert "--stop-after 3400" in made["command"] and made["threads"] == 1


@pytest.mark.parametrize("replay", [True, False])
def test_oracle_answers_the_readme_question(replay):
    model = load_reference(RETRIEVAL_DIR)
    tt = TaskTokenizer(train_tokenizer(model.cfg.vocab_size))
    for name, code in (("quill", "905361"), ("amber", "418207")):
        ids = [BOS_ID] + tt.encode(DOC + f"what is the code of {name}?\n")
        with torch.no_grad():
            out = model.generate(ids, 7, replay=replay)
        assert tt.tok.decode(out[:6]) == code and out[6] == model.cfg.eos_token_id, (name, out)
