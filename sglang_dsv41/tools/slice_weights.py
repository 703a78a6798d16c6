"""flash-slice's files: weights generated tensor by tensor on a device, one shard per layer.

Each stored tensor comes from its dense value: `counter_normal` (the same bits on CPU and GPU)
under the release initialiser's `init_affine`, quantized by the release's kind
(`release_checkpoint.quantize_release`: FP8 32x32 blocks, packed FP4 per 32, FP8 rows, BF16,
FP32) on the generating device, then moved to host memory. Large tables are drawn in row chunks
of at most CHUNK elements (a multiple of 32 rows, so FP8 blocks never straddle two chunks).
Shards: model-00001 holds embed, norm and head, model-0000{j+2} layer j, written through
`release_checkpoint.write_shards` (the one writer of the released file format), each generated
only when it is written, so host memory holds one layer (7.2 GiB at V4.1-Flash widths). A DSpark
head (`--dspark`) follows in one shard per stage, its tensors in their own storage kinds
(`dspark_manifest.dspark_release_kind`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.tools.counter_normal import counter_normal, tensor_key
from sglang_dsv41.tools.outdir import prepare_out_dir
from sglang_dsv41.tools.progress import progress as progress_line
from sglang_dsv41.tools.release_checkpoint import (
    apply_affine,
    init_affine,
    quantize_release,
    write_shards,
)
from sglang_dsv41.tools.slice_config import (
    ENGRAM_VOCAB,
    RELEASE_LAYERS,
    TRAINED_VOCAB,
    slice_config,
    slice_text_config,
)
from sglang_dsv41.weights.dspark_manifest import (
    PREFIX as DSPARK_PREFIX,
)
from sglang_dsv41.weights.dspark_manifest import (
    dspark_release_kind,
    dspark_release_tensors,
)
from sglang_dsv41.weights.release_manifest import FP4, release_kind, release_manifest

CHUNK = 1 << 24
SLICE_NOTE = "flash_slice.json"
"""What the slice was made from (release layers, seed, Engram vocabulary), beside config.json."""


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU raises."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return dev


def kind_of(name: str) -> str:
    """Storage kind of a dense name: the DSpark head's rules for mtp.*, the release's else."""
    return dspark_release_kind(name) if name.startswith(DSPARK_PREFIX) else release_kind(name)


def dense_entries(cfg: DeepseekV41Config) -> dict:
    """Dense name -> dense shape [N, K] (or [N]) of every stored tensor that is not a scale,
    the DSpark head's (when the config declares one) last."""
    out = {}
    for name, (shape, _) in {**release_manifest(cfg), **dspark_release_tensors(cfg)}.items():
        if name.endswith(".scale"):
            continue
        out[name] = (shape[0], shape[1] * 2) if kind_of(name) == FP4 else tuple(shape)
    return out


def stored_tensors(name: str, shape: tuple, seed: int, device: torch.device) -> dict:
    """{name[, scale name]: host tensor} of one dense tensor of `shape`, generated on device."""
    mean, std = init_affine(name, shape)
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    key = tensor_key(seed, name)
    step = max(32, CHUNK // cols // 32 * 32)
    parts: dict = {}
    for r0 in range(0, rows, step):
        x = apply_affine(counter_normal(key, min(step, rows - r0), cols, device, r0), mean, std)
        dense = x.view(shape) if len(shape) == 1 else x
        for k, v in quantize_release(name, dense, kind_of).items():
            parts.setdefault(k, []).append(v.cpu())
    return {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in parts.items()}


def _group_of(name: str) -> str:
    """'layers.{j}.' / 'mtp.{k}.' for a layer's or a DSpark stage's tensor, else 'model'."""
    for head in ("layers.", DSPARK_PREFIX):
        if name.startswith(head):
            return name[: name.index(".", len(head)) + 1]
    return "model"


def shard_groups(cfg: DeepseekV41Config) -> list:
    """[(file name, [dense names])]: the non-layer tensors first, then one shard per layer,
    then one per DSpark stage."""
    groups: dict = {"model": []}
    for j in range(cfg.num_hidden_layers):
        groups[f"layers.{j}."] = []
    for name in dense_entries(cfg):
        groups.setdefault(_group_of(name), []).append(name)
    n = len(groups)
    return [
        (f"model-{i + 1:05d}-of-{n:05d}.safetensors", names)
        for i, names in enumerate(groups.values())
    ]


def slice_shards(cfg: DeepseekV41Config, seed: int, device: torch.device, progress: bool):
    """Yield (file name, {stored name: host tensor}) per shard, generating each when asked."""
    shapes = dense_entries(cfg)
    done, total = 0, len(shapes)
    for fname, names in shard_groups(cfg):
        tensors = {}
        for name in names:
            tensors.update(stored_tensors(name, shapes[name], seed, device))
            done += 1
            if progress:
                progress_line(done, total, f"weights on {device.type}")
        yield fname, tensors


def write_flash_slice(
    out_dir,
    layers=RELEASE_LAYERS,
    engram_vocab: int = ENGRAM_VOCAB,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    progress: bool = True,
    widths: dict | None = None,
    dspark_experts: int | None = None,
) -> Path:
    """Write the flash-slice checkpoint (tools/flash_slice.py) into out_dir; returns it.
    widths: text fields to override (reduced widths for CPU tests), None for the release's;
    dspark_experts: None for no DSpark head, else its stages' routed experts."""
    from tokenizers import Tokenizer

    from sglang_dsv41.layers.engram import compressed_token_map
    from sglang_dsv41.tools.tokenizer import save_tokenizer

    dev = resolve_device(device)
    text = slice_text_config(layers, engram_vocab, widths=widths, dspark_experts=dspark_experts)
    out = prepare_out_dir(out_dir, force)
    trained = min(TRAINED_VOCAB, text["vocab_size"])
    save_tokenizer(out, text["vocab_size"], text["max_position_embeddings"], trained_size=trained)
    _, vc = compressed_token_map(Tokenizer.from_file(str(out / "tokenizer.json")))
    config = slice_config(slice_text_config(layers, engram_vocab, vc, widths, dspark_experts))
    cfg = DeepseekV41Config.from_dict(config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    note = {
        "release_layers": [int(v) for v in layers],
        "seed": seed,
        "engram_vocab": engram_vocab,
        "dspark_experts": dspark_experts,
    }
    (out / SLICE_NOTE).write_text(json.dumps(note) + "\n", encoding="utf-8")
    count = len(shard_groups(cfg))
    return write_shards(out, slice_shards(cfg, seed, dev, progress), count, progress)
