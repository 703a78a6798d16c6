"""Released-format checkpoints: `flash-mini` (synthetic, written) and `flash-shapes` (checked).

    python -m sglang_dsv41.tools.release_checkpoint --preset flash-mini --out DIR [--seed 0]
    python -m sglang_dsv41.tools.release_checkpoint --preset flash-shapes [--check DIR] [--list]

flash-mini: the release's config.json layout (text_config / vision_config /
quantization_config, 43 compress_ratios) and its text tensor name set (all 40 layers, every
attention role, mHC on every layer, Engram on layers 1 and 14, 8 routed experts per MoE layer
instead of 384), stored as the release stores them: FP8 e4m3 + UE8M0 32x32-block `.scale`,
packed-e2m1 int8 experts + per-32 UE8M0 `.scale`, FP8 engram rows + per-32 scales, BF16, FP32.
Widths are reduced (see weights/release_config.py). A second shard holds the DSpark draft head
(`dspark_*` keys in text_config, `mtp.*` tensors: weights/dspark_manifest.py) and a few
placeholder `vision.*`, `aligner.*` and `image_*` tensors, so the loader's skip path runs (the
placeholders' names beyond the prefixes are not audited). Files: config.json, model-00001-of-00002.
safetensors, model-00002-of-00002.safetensors, model.safetensors.index.json, tokenizer files.
Same seed -> same bytes.

flash-shapes: the full-size manifest (93,418 text tensors, ~467 GiB) from the full released
config, printed as a summary (`--list`: every name, dtype, shape) without allocating a weight;
`--check DIR` validates a checkpoint directory's safetensors headers against it (header reads
only, so it runs on the real 475 GiB checkpoint in seconds).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import sys
from pathlib import Path

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.tools.outdir import prepare_out_dir
from sglang_dsv41.tools.progress import progress as progress_line
from sglang_dsv41.weights.dspark_manifest import (
    dspark_config,
    dspark_release_kind,
    dspark_release_tensors,
)
from sglang_dsv41.weights.quant import quant_fp4_packed, quant_fp8_block, quant_fp8_rows
from sglang_dsv41.weights.release_config import (
    flash_mini_text_config,
    flash_mini_vision_config,
    flash_text_config,
    flash_vision_config,
    release_config,
)
from sglang_dsv41.weights.release_manifest import (
    FP4,
    FP8,
    FP8_ROWS,
    FP32,
    manifest_bytes,
    release_kind,
    release_manifest,
    scale_name,
)

PRESETS = ("flash-mini", "flash-shapes")
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def flash_config() -> DeepseekV41Config:
    """The full-size released config (validated)."""
    return DeepseekV41Config.from_dict(release_config(flash_text_config(), flash_vision_config()))


def _gen(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def init_affine(name: str, shape: tuple) -> tuple[float, float]:
    """(mean, std) of one dense tensor's random init, applied to a standard normal draw.
    Matrices N(0, 1/fan_in), norm gains 1 + N(0, .05), embeddings N(0, 1), sinks N(0, .1),
    router biases N(0, .01); mHC fn N(0, 1/fan_in), base N(0, .5), scale 1 + N(0, .1); engram
    q/k weights 1 + N(0, .05)."""
    if name.endswith(("hc_attn_base", "hc_ffn_base")):
        return 0.0, 0.5
    if name.endswith(("hc_attn_scale", "hc_ffn_scale")):
        return 1.0, 0.1
    if name.endswith(("engram.q_weight", "engram.k_weight")):
        return 1.0, 0.05
    if name.endswith(("engram.embed.weight", "embed.weight")):
        return 0.0, 1.0
    if name.endswith(("gate.bias_vl", "gate.bias")):
        return 0.0, 0.01
    if name.endswith("norm.weight"):
        return 1.0, 0.05
    if name.endswith("attn_sink"):
        return 0.0, 0.1
    if len(shape) != 2:
        raise ValueError(f"no init rule for {name} {tuple(shape)}")
    return 0.0, shape[1] ** -0.5


def apply_affine(x: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """x * std (+ mean): one rounding per operation, the same bits on every device."""
    return x * std if mean == 0.0 else mean + std * x


def dense_init(name: str, shape: tuple, cfg: DeepseekV41Config, seed: int) -> torch.Tensor:
    """fp32 random value of one dense tensor: a seeded CPU normal draw under `init_affine`."""
    mean, std = init_affine(name, shape)
    return apply_affine(torch.randn(shape, generator=_gen(seed, name)), mean, std)


def quantize_release(name: str, w: torch.Tensor, kind_of=release_kind) -> dict:
    """One dense fp32 tensor -> its stored tensors ({name[, scale name]: tensor}) by its kind
    (`kind_of(name)`), on w's device."""
    kind = kind_of(name)
    if kind in (FP8, FP4, FP8_ROWS):
        q, s = {FP8: quant_fp8_block, FP4: quant_fp4_packed, FP8_ROWS: quant_fp8_rows}[kind](w)
        return {name: q, scale_name(name): s}
    return {name: w.to(torch.float32 if kind == FP32 else torch.bfloat16)}


def release_tensors(
    cfg: DeepseekV41Config,
    seed: int = 0,
    progress: bool = False,
    manifest: dict | None = None,
    kind_of=release_kind,
) -> dict:
    """Stored name -> tensor of every tensor of `manifest` (default: release_manifest(cfg), the
    text model), quantized by `kind_of(dense name)`."""
    manifest = release_manifest(cfg) if manifest is None else manifest
    names = [n for n in manifest if not n.endswith(".scale")]
    out = {}
    for i, name in enumerate(names):
        if progress:
            progress_line(i + 1, len(names), "weights")
        shape = manifest[name][0]
        if kind_of(name) == FP4:
            shape = (shape[0], shape[1] * 2)
        out.update(quantize_release(name, dense_init(name, shape, cfg, seed), kind_of))
    return out


def placeholder_skipped(cfg: DeepseekV41Config, seed: int = 0) -> dict:
    """The tensors outside the text model: the DSpark draft head (`mtp.*`, real names and
    shapes, weights.dspark_manifest) and a few vision / aligner / image_* placeholders."""
    d = cfg.hidden_size
    out = release_tensors(
        cfg, seed, manifest=dspark_release_tensors(cfg), kind_of=dspark_release_kind
    )
    out["vision.patch_embed.weight"] = torch.zeros(32, 3 * 14 * 14, dtype=torch.bfloat16)
    out["aligner.proj.weight"] = torch.zeros(d, 32, dtype=torch.bfloat16)
    for part in ("image_start", "image_end", "image_newline"):
        out[part] = torch.zeros(d, dtype=torch.bfloat16)
    return out


def write_flash_mini(
    out_dir, seed: int = 0, force: bool = False, widths=None, progress: bool = False
) -> Path:
    """Write the flash-mini checkpoint (see module docstring); returns the directory.
    widths: text_config fields to override (e.g. hidden_size), None for flash-mini's own;
    progress: report on stderr."""
    from sglang_dsv41.layers.engram import compressed_token_map
    from sglang_dsv41.tools.tokenizer import save_tokenizer

    out = prepare_out_dir(out_dir, force)
    text = {**flash_mini_text_config(), **(widths or {})}
    text.update(dspark_config(text))
    save_tokenizer(out, text["vocab_size"], text["max_position_embeddings"])
    from tokenizers import Tokenizer

    _, vc = compressed_token_map(Tokenizer.from_file(str(out / "tokenizer.json")))
    text["engram_compressed_vocab_size"] = vc
    config = release_config(text, flash_mini_vision_config())
    cfg = DeepseekV41Config.from_dict(config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    shards = (release_tensors(cfg, seed, progress), placeholder_skipped(cfg, seed))
    return write_shards(out, zip(SHARDS, shards, strict=True), len(SHARDS), progress)


def write_shards(out: Path, shards, count: int, progress: bool = False) -> Path:
    """The released file format: each (file name, {name: tensor}) of `shards` (an iterable,
    consumed one shard at a time, so a writer can stream a checkpoint larger than memory) as a
    safetensors file, then `model.safetensors.index.json` (weight map, total size)."""
    from safetensors.torch import save_file

    weight_map, total = {}, 0
    for i, (fname, tensors) in enumerate(shards):
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        (out / fname).chmod(0o644)  # safetensors creates 0600; servers in containers read it
        weight_map.update({n: fname for n in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        if progress:
            progress_line(i + 1, count, "shards written")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def flash_shapes(check_dir=None, list_all: bool = False, stream=None) -> dict:
    """Print the full-size manifest summary (or every entry); validate `check_dir` against it."""
    stream = sys.stdout if stream is None else stream
    cfg = flash_config()
    manifest = release_manifest(cfg)
    kinds = collections.Counter()
    size = collections.Counter()
    for name, (shape, dtype) in manifest.items():
        key = "scale" if name.endswith(".scale") else release_kind(name)
        kinds[key] += 1
        size[key] += manifest_bytes({name: (shape, dtype)})
    print(
        f"V4.1-Flash text manifest: {len(manifest)} tensors, "
        f"{manifest_bytes(manifest) / 2**30:.2f} GiB (skipped at load: vision.*, aligner.*, "
        "image_*, mtp.*)",
        file=stream,
    )
    for key in sorted(kinds):
        print(f"  {key:9s} {kinds[key]:6d} tensors {size[key] / 2**30:9.2f} GiB", file=stream)
    if list_all:
        for name, (shape, dtype) in manifest.items():
            print(f"{name}\t{str(dtype).removeprefix('torch.')}\t{list(shape)}", file=stream)
    if check_dir is not None:
        from sglang_dsv41.weights.checkpoint import scan_checkpoint, validate_release

        found, _ = scan_checkpoint(str(check_dir))
        skipped = validate_release(found, cfg, str(check_dir))
        print(
            f"{check_dir}: all {len(manifest)} text tensors match; {skipped} skipped", file=stream
        )
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.release_checkpoint",
        description="Released-format V4.1-Flash checkpoints: write flash-mini, check flash-shapes.",
    )
    parser.add_argument("--preset", required=True, choices=PRESETS)
    parser.add_argument("--out", help="output directory (flash-mini)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    parser.add_argument("--check", help="flash-shapes: validate this checkpoint directory")
    parser.add_argument("--list", action="store_true", help="flash-shapes: print every tensor")
    args = parser.parse_args(argv)
    if args.preset == "flash-shapes":
        from sglang_dsv41.weights.checkpoint import WeightFormatError

        try:
            flash_shapes(args.check, args.list)
        except WeightFormatError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if not args.out:
        parser.error("--out is required for flash-mini")
    try:
        out = write_flash_mini(args.out, args.seed, args.force, progress=True)
    except ValueError as e:
        parser.error(str(e))
    total = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote flash-mini checkpoint (seed {args.seed}, {total / 1e6:.1f} MB) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
