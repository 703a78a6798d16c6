"""Write a trained model as a servable checkpoint directory.

    config.json        `tools.make_checkpoint.checkpoint_config(preset)` (the released layout)
                       without its `dspark_*` keys: a trained model has no draft head
    model.safetensors  every tensor of `manifest.tensor_manifest(cfg)`, fp32, in manifest order
    tokenizer files    `tools.tokenizer.save_tokenizer` (the byte-level BPE the model was
                       trained with: it is rebuilt from the shipped corpus, byte for byte)
    training.json      how the weights were made (seed, steps, stages, command, figures)

The same directory loads with `reference.load_reference` and serves with
`python -m sglang.launch_server --model-path DIR`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_dsv41.manifest import tensor_manifest
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.tools.make_checkpoint import checkpoint_config
from sglang_dsv41.tools.outdir import prepare_out_dir
from sglang_dsv41.tools.tokenizer import save_tokenizer

TRAINING_FILE = "training.json"


def trained_config(preset: str) -> dict:
    """The preset's checkpoint config.json without the DSpark draft head's keys."""
    config = checkpoint_config(preset)
    text = config.get("text_config", config)
    for k in [k for k in text if k.startswith("dspark_")]:
        del text[k]
    return config


def export_checkpoint(model: ReferenceModel, preset: str, out_dir, info: dict) -> Path:
    """Write the checkpoint of `model` (built from preset `preset`) into out_dir (overwritten)."""
    from safetensors.torch import save_file

    cfg = model.cfg
    out = prepare_out_dir(out_dir, force=True)
    state = model.state_dict()
    manifest = tensor_manifest(cfg, dense_dtype=torch.float32)
    if set(state) != set(manifest):
        raise ValueError(
            f"model tensors differ from the manifest: {sorted(set(state) ^ set(manifest))[:8]}"
        )
    tensors = {
        name: state[name].detach().to("cpu", dtype).contiguous()
        for name, (_, dtype) in manifest.items()
    }
    config = trained_config(preset)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    weights = out / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    save_tokenizer(out, cfg.vocab_size, cfg.max_position_embeddings)
    (out / TRAINING_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
