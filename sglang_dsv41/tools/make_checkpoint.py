"""Write a seeded random V4.1 checkpoint: config.json, model.safetensors and a tokenizer.

    python -m sglang_dsv41.tools.make_checkpoint --preset tiny --out DIR [--seed 0] [--force]
    python -m sglang_dsv41.tools.make_checkpoint --preset flash-mini --out DIR    (released format)
    python -m sglang_dsv41.tools.make_checkpoint --preset flash-shapes [--check DIR] [--list]

The two released-format presets are handled by `tools.release_checkpoint` (FP8/FP4 weights with
UE8M0 scales, mHC, Engram; flash-shapes prints or checks the full-size manifest, no weights).

config.json has the released layout: `architectures`, `model_type`, `torch_dtype`, bos / eos ids
and what SGLang reads (`vision_n_layers: 0`, `tie_word_embeddings: false`) at the top level, the
other text fields of the preset under `text_config` (`--flat` puts them all at the top level;
`DeepseekV41Config.from_dict` reads both). The nested layout is the default because a flat yarn
`rope_scaling` makes `AutoTokenizer.from_pretrained(DIR)` crash in transformers 5.x while it
builds a generic config for the unregistered `deepseek_v41` model type.

model.safetensors holds every tensor of `manifest.tensor_manifest(cfg)` in the preset's
`torch_dtype` (fp32 where the manifest says so), and the DSpark draft head the config declares
(`dspark_*` keys, `mtp.*` tensors: weights/dspark_manifest.py), which SGLang's speculative
decoding reads and this package's text loaders skip. The tokenizer is a byte-level BPE trained
on the shipped corpus (`tools.tokenizer`).

Same preset and seed -> identical bytes in every file: each tensor draws from its own generator,
seeded by sha256(seed, name), so tensors do not depend on the order they are made in.

Initialisation:
    embed.weight               N(0, 1)
    *norm.weight               1 + N(0, 0.05^2)          (RMSNorm gains near 1)
    attn_sink                  N(0, 0.1^2)               (small sink logits)
    ffn.gate.bias              N(0, 0.01^2)              (small router bias)
    hc_*_base / hc_*_scale     N(0, 0.5^2) / 1 + N(0, 0.1^2)   (mHC, hc_mult > 1 only)
    engram.{q,k}_weight        1 + N(0, 0.05^2);  engram.embed.weight N(0, 1)
    matrices [out, in]         N(0, 1 / in)              (head: std 1 / sqrt(hidden))
(the same values as `tools.release_checkpoint.dense_init`).
Measured with the reference on `tiny` (fp32, 256 random tokens): the residual RMS grows from 1.0
(embedding) to 3.4 after layer 11 (3.8 after layer 15 on `small`), logits have std 1.0, 182 of
256 positions have distinct argmaxes, and the next token after a fixed last token depends on the
context (7 of 8 random 48-token contexts differ), so attention visibly matters. Dividing the
residual writes by sqrt(2 layers) (GPT-2 style) made the model nearly a bigram table (3 of 8).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.manifest import tensor_manifest
from sglang_dsv41.presets import PRESETS
from sglang_dsv41.tools.outdir import prepare_out_dir
from sglang_dsv41.tools.progress import progress as progress_line
from sglang_dsv41.weights.dspark_manifest import dspark_config, dspark_tensors

TOO_BIG = ("flash",)
"""Presets whose random weights are too large to write; config geometry only."""
NORM_GAIN_STD, SINK_STD, ROUTER_BIAS_STD = 0.05, 0.1, 0.01


def checkpoint_config(name: str, text_config: bool = True) -> dict:
    """The config.json dict for preset `name` (validated through DeepseekV41Config)."""
    text = PRESETS[name]()
    text.update(dspark_config(text))
    DeepseekV41Config.from_dict(text)
    extra = {"vision_n_layers": 0, "tie_word_embeddings": False}
    if not text_config:
        return {**text, **extra}
    top = ("architectures", "model_type", "torch_dtype", "bos_token_id", "eos_token_id")
    nested = {k: v for k, v in text.items() if k not in top}
    return {**{k: text[k] for k in top if k in text}, **extra, "text_config": nested}


def init_tensor(name: str, shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """One seeded random tensor [shape] in dtype; the rule is in the module docstring."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("embed.weight"):
        pass
    elif name.endswith(("norm.weight", "engram.q_weight", "engram.k_weight")):
        x = 1.0 + NORM_GAIN_STD * x
    elif name.endswith(("hc_attn_base", "hc_ffn_base")):
        x = 0.5 * x
    elif name.endswith(("hc_attn_scale", "hc_ffn_scale")):
        x = 1.0 + 0.1 * x
    elif name.endswith("attn_sink"):
        x = SINK_STD * x
    elif name.endswith("gate.bias"):
        x = ROUTER_BIAS_STD * x
    elif len(shape) == 2:
        x = shape[1] ** -0.5 * x
    else:
        raise ValueError(f"no init rule for {name} {tuple(shape)}")
    return x.to(dtype)


def checkpoint_manifest(cfg: DeepseekV41Config) -> dict:
    """name -> (shape, dtype) of every tensor written: the text model's and the DSpark head's
    (`mtp.*`, when cfg declares one)."""
    dtype = getattr(torch, cfg.torch_dtype)
    return {**tensor_manifest(cfg, dense_dtype=dtype), **dspark_tensors(cfg, dense_dtype=dtype)}


def random_weights(cfg: DeepseekV41Config, seed: int = 0, progress: bool = False) -> dict:
    """name -> tensor for every entry of checkpoint_manifest(cfg), in manifest order."""
    manifest = checkpoint_manifest(cfg)
    out = {}
    for i, (name, (shape, dtype)) in enumerate(manifest.items()):
        out[name] = init_tensor(name, shape, dtype, seed)
        if progress:
            progress_line(i + 1, len(manifest), "weights")
    return out


def manifest_bytes(cfg: DeepseekV41Config) -> int:
    manifest = checkpoint_manifest(cfg)
    return sum(math.prod(s) * d.itemsize for s, d in manifest.values())


def write_checkpoint(
    out_dir,
    name: str = "tiny",
    seed: int = 0,
    force: bool = False,
    text_config: bool = True,
    progress: bool = False,
) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into out_dir."""
    from safetensors.torch import save_file

    from sglang_dsv41.tools.tokenizer import save_tokenizer

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    cfg = DeepseekV41Config.from_dict(checkpoint_config(name, text_config=False))
    if name in TOO_BIG:
        gb = manifest_bytes(cfg) / 1e9
        raise ValueError(
            f"preset {name!r} would need {gb:,.0f} GB of random weights; "
            "make_checkpoint writes 'tiny' or 'small' (the flash geometry is "
            "available as sglang_dsv41.config.preset('flash'))"
        )
    out = prepare_out_dir(out_dir, force)
    (out / "config.json").write_text(
        json.dumps(checkpoint_config(name, text_config), indent=2) + "\n", encoding="utf-8"
    )
    weights = out / "model.safetensors"
    save_file(random_weights(cfg, seed, progress), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it 0600; other users (containers) must read it
    save_tokenizer(out, cfg.vocab_size, cfg.max_position_embeddings)
    return out


RELEASE_PRESETS = ("flash-mini", "flash-shapes")
"""Released-format presets, handled by tools.release_checkpoint (FP8/FP4 weights, mHC, Engram)."""


def main(argv=None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset")
    known, _ = pre.parse_known_args(argv)
    if known.preset in RELEASE_PRESETS:
        from sglang_dsv41.tools.release_checkpoint import main as release_main

        return release_main(argv)
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.make_checkpoint",
        description="Write a seeded random DeepSeek-V4.1 checkpoint with a tokenizer.",
    )
    parser.add_argument(
        "--preset",
        default="tiny",
        help=f"one of {sorted(PRESETS)} "
        f"(weights refused for {', '.join(TOO_BIG)}: too big), or "
        f"{' / '.join(RELEASE_PRESETS)} (released format, see "
        "tools.release_checkpoint)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    parser.add_argument(
        "--flat",
        action="store_true",
        help="text fields at the top level of config.json instead of under "
        "text_config (the released layout)",
    )
    args = parser.parse_args(argv)
    try:
        out = write_checkpoint(
            args.out, args.preset, args.seed, args.force, not args.flat, progress=True
        )
    except ValueError as e:
        parser.error(str(e))
    size = (out / "model.safetensors").stat().st_size
    print(f"wrote {args.preset} checkpoint (seed {args.seed}, {size / 1e6:.1f} MB) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
