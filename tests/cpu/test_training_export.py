"""A trained model leaves as a checkpoint the oracle loads, and a resumed run equals an
uninterrupted one bit for bit."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from sglang_dsv41.config import preset
from sglang_dsv41.reference import load_reference
from sglang_dsv41.training.export import TRAINING_FILE, export_checkpoint
from sglang_dsv41.training.init import initial_model
from sglang_dsv41.training.train import main as train_main


def test_export_loads_in_the_oracle(tmp_path):
    model = initial_model(preset("tiny"), seed=5)
    out = export_checkpoint(model, "tiny", tmp_path / "ckpt", {"seed": 5})
    assert json.loads((out / TRAINING_FILE).read_text()) == {"seed": 5}
    loaded = load_reference(out)
    ids = torch.randint(2, 512, (90,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded.forward(ids), model.forward(ids))
    for path in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / path).is_file()
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["num_hidden_layers"] == 12 and not any(k.startswith("dspark_") for k in text)


def test_export_writes_the_shipped_retrieval_config(tmp_path):
    """The shipped config is what the export writes (no DSpark keys: no draft head)."""
    from sglang_dsv41.tools.serve import RETRIEVAL_DIR
    from sglang_dsv41.training.export import trained_config

    assert json.loads((RETRIEVAL_DIR / "config.json").read_text()) == trained_config("retrieval")


def test_resumed_run_equals_the_uninterrupted_run(tmp_path):
    common = ["--preset", "tiny", "--batch", "1", "--scale", "0.002", "--probe-every", "1000"]
    common += ["--save-every", "2"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    args = ["--out", str(whole), "--state", str(tmp_path / "w.pt"), "--log", str(tmp_path / "w")]
    assert train_main(common + args) == 0
    args = ["--out", str(parts), "--state", str(tmp_path / "p.pt"), "--log", str(tmp_path / "p")]
    assert train_main(common + args + ["--stop-after", "2"]) == 0
    assert train_main(common + args) == 0
    a = load_file(str(whole / "model.safetensors"))
    b = load_file(str(parts / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def steps(log):
        return [r["step"] for r in map(json.loads, log.read_text().splitlines()) if "step" in r]

    assert steps(tmp_path / "p") == steps(tmp_path / "w") == [1, 2, 3, 4, 5, 6, 7]  # + polish
