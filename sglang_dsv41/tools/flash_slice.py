"""flash-slice: a few of V4.1-Flash's layers at full width, in the released format.

    python -m sglang_dsv41.tools.flash_slice --out DIR [--layers 1,2,3,20,21,24]
        [--engram-vocab 41667] [--seed 0] [--device auto|cuda|cpu] [--force]
        [--dspark [--dspark-experts 16]]
    python -m sglang_dsv41.tools.flash_slice --report [--json] [--mem-fraction 0.85] [--dspark]
    python -m sglang_dsv41.tools.flash_slice --list            (every tensor, no weights)

Slice layer j is release layer `layers[j]` with that layer's exact geometry, tensor names (under
`layers.{j}.`), dtypes and storage (FP8 e4m3 32x32 blocks with UE8M0 scales, packed-FP4 routed
experts, all 384 of them, mHC on every layer, Engram rows of 256 FP8 values). Everything outside
the layers (embed, head, norm, vocabulary of 129,280, quantization_config, YaRN, the 3 MTP
stages' trailing zeros in compress_ratios) is the release's. Roles are config, so the role lists
are re-indexed onto slice positions; with the default layers:

    slice  release  ratio  role                                         lists it is in
      0       1       0    SWA, Engram                                  engram_layer_ids
      1       2       2    Full (encoder)                               kv_source, index_source
      2       3       2    Reuse of 1                                   -
      3      20       1    Full, decoder start, candidate source        kv_source, index_source,
                                                                        candidate_source
      4      21       1    Reuse of 3                                   -
      5      24       1    Reindex over the candidate pool (reads 3)    index_source

So kv_source_layer_ids [1, 3], index_source_layer_ids [1, 3, 5], candidate_source_layer_id 3,
engram_layer_ids [0]. Six is the fewest layers that hold every role, Engram and the decoder start:
the decoder starts at num_hidden_layers // 2 and must be the last kv source (the candidate
source), so the encoder and the decoder have three layers each (SWA, Full-2, Reuse-2; Full-1,
Reuse-1, Reindex). Release layer 0 (SWA without Engram) adds nothing a slice needs.

Engram tables are cut: `engram_vocab_size` (default 41,667; the release's is 16,000,000) sets the
24 hash moduli (the first primes at or above it), and the table has their sum of rows, 1,003,416
at the default (the release's layer-1 table: 384,006,168); the row width (256) and the FP8 row
format are the release's. The tokenizer is the package's byte-level BPE (1,024 trained entries)
padded to the release's 129,280 (`tools.tokenizer.pad_vocab`), and engram_compressed_vocab_size
is that tokenizer's.

Random weights by the release initialiser's rules (`release_checkpoint.init_affine`) over
`counter_normal`, whose values are the same bits on CPU and GPU: the same seed gives the same
bytes on either. Generated with torch on the GPU when there is one (`--device auto`), else on the
CPU (hours at full size: the GPU path is the one meant). Files: config.json, tokenizer files,
model-00001-of-000NN.safetensors (embed, norm, head) then one shard per layer, and
model.safetensors.index.json. Size, KV room on one H200: `--report` (docs/h200_head_to_head.md
has the figures).

`--dspark` (off by default) adds a DSpark draft head (weights/dspark_manifest.py: the presets'
`dspark_*` keys, 3 stages on slice layers [1, 3, 4], blocks of 5, `mtp.*` tensors in the
release's formats, one shard per stage) so that SGLang's `--speculative-algorithm DSPARK` can
serve the slice. Each stage is a full-width V4 decoder layer; its routed experts are cut to
`--dspark-experts` (default 16, SGLang's `dspark_n_routed_experts`; 384 keeps the release's
width): 1.69 GiB at 16, 21.03 GiB at 384, against the slice's 44.18 GiB and a 64 GiB disk. A
random head accepts few drafts whatever its width.
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.tools.slice_config import (
    DSPARK_EXPERTS,
    ENGRAM_VOCAB,
    RELEASE_LAYERS,
    SliceError,
    layer_table,
    slice_text_config,
)
from sglang_dsv41.weights.dspark_manifest import dspark_release_tensors
from sglang_dsv41.weights.release_manifest import manifest_bytes, release_manifest


def report(text: dict, mem_fraction: float, gpu_gib: float) -> dict:
    """Size of the slice and its KV room on one GPU of `gpu_gib`, from the one byte calculator:
    budget = gpu_gib x mem_fraction - weights; tokens of context = budget / bytes per token, for
    this package's records and for V4's 584 B records (stock SGLang on Hopper)."""
    from sglang_dsv41.tools.kv_capacity import GiB, dsv41_footprint, v4_footprint

    cfg = DeepseekV41Config.from_dict(text)
    manifest = release_manifest(cfg)
    head = manifest_bytes(dspark_release_tensors(cfg))
    weights = manifest_bytes(manifest) + head
    budget = gpu_gib * GiB * mem_fraction - weights
    layouts = {}
    for fp in (dsv41_footprint(cfg), v4_footprint(cfg)):
        layouts[fp.layout] = {
            "bytes_per_token": fp.per_token,
            "swa_bytes_per_request": fp.per_request,
            "tokens": int(max(budget, 0) // fp.per_token),
            "longest_context": int(max(budget - fp.per_request, 0) // fp.per_token),
        }
    return {
        "layers": cfg.num_hidden_layers,
        "tensors": len(manifest) + len(dspark_release_tensors(cfg)),
        "weights_gib": weights / GiB,
        "dspark_gib": head / GiB,
        "engram_rows": list(cfg.engram_num_embeddings),
        "gpu_gib": gpu_gib,
        "mem_fraction_static": mem_fraction,
        "kv_budget_gib": budget / GiB,
        "layouts": layouts,
    }


def _print_report(rep: dict, rows: list, stream) -> None:
    print(
        f"flash-slice: {rep['layers']} layers, {rep['tensors']} tensors, "
        f"{rep['weights_gib']:.2f} GiB; Engram rows {rep['engram_rows']}",
        file=stream,
    )
    if rep["dspark_gib"]:
        print(f"  of which the DSpark head {rep['dspark_gib']:.2f} GiB", file=stream)
    for j, layer, ratio, role, notes in rows:
        print(f"  slice {j}  release {layer:2d}  ratio {ratio}  {role:8s} {notes}", file=stream)
    print(
        f"one GPU of {rep['gpu_gib']:.1f} GiB at --mem-fraction-static "
        f"{rep['mem_fraction_static']}: {rep['kv_budget_gib']:.1f} GiB after the weights",
        file=stream,
    )
    for name, lay in rep["layouts"].items():
        print(
            f"  {name:5s} {lay['bytes_per_token']:7.1f} B/token -> {lay['tokens']:,} tokens "
            f"(one request: {lay['longest_context']:,})",
            file=stream,
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_dsv41.tools.flash_slice", description=__doc__
    )
    ap.add_argument("--out", help="output directory (writes the checkpoint)")
    ap.add_argument("--layers", default=",".join(map(str, RELEASE_LAYERS)))
    ap.add_argument("--engram-vocab", type=int, default=ENGRAM_VOCAB)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    ap.add_argument("--report", action="store_true", help="size and KV room, no weights")
    ap.add_argument("--list", action="store_true", help="print every tensor, no weights")
    ap.add_argument("--json", action="store_true", help="--report as JSON")
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--gpu-gib", type=float, default=139.8, help="GPU memory (H200: 139.8)")
    ap.add_argument("--dspark", action="store_true", help="add a DSpark draft head (mtp.*)")
    ap.add_argument(
        "--dspark-experts",
        type=int,
        default=DSPARK_EXPERTS,
        help="routed experts per DSpark stage (384: the release's width)",
    )
    a = ap.parse_args(argv)
    layers = [int(v) for v in a.layers.split(",") if v.strip()]
    experts = a.dspark_experts if a.dspark else None
    try:
        text = slice_text_config(layers, a.engram_vocab, dspark_experts=experts)
    except SliceError as e:
        ap.error(str(e))
    cfg = DeepseekV41Config.from_dict(text)
    if a.list:
        for name, (shape, dtype) in {
            **release_manifest(cfg),
            **dspark_release_tensors(cfg),
        }.items():
            print(f"{name}\t{str(dtype).removeprefix('torch.')}\t{list(shape)}")
        return 0
    rep = report(text, a.mem_fraction, a.gpu_gib)
    if a.report or not a.out:
        if a.json:
            print(json.dumps(rep, indent=2))
        else:
            _print_report(rep, layer_table(cfg, layers), sys.stdout)
        return 0
    from sglang_dsv41.tools.slice_weights import write_flash_slice

    try:
        out = write_flash_slice(
            a.out, layers, a.engram_vocab, a.seed, a.device, a.force, dspark_experts=experts
        )
    except ValueError as e:
        ap.error(str(e))
    total = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote flash-slice (seed {a.seed}, {total / 2**30:.2f} GiB) to {out}")
    _print_report(rep, layer_table(cfg, layers), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
