"""flash-slice's config: which release layers a slice keeps, its roles re-indexed onto slice
positions, its Engram tables cut (tools/flash_slice.py's docstring has the table and the rules).

The command (flash_slice.py) and the weight writer (slice_weights.py) both stand on this file;
it imports neither.
"""

from __future__ import annotations

from sglang_dsv41.config import FULL, REINDEX, REUSE, SWA, DeepseekV41Config
from sglang_dsv41.weights.dspark_manifest import dspark_config
from sglang_dsv41.weights.release_config import (
    engram_table_rows,
    flash_text_config,
    flash_vision_config,
    release_config,
)

RELEASE_LAYERS = (1, 2, 3, 20, 21, 24)
ENGRAM_VOCAB = 41_667
TRAINED_VOCAB = 1024
ROLE_LISTS = ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids")
DSPARK_EXPERTS = 16
"""Routed experts of each DSpark stage with `--dspark` (the release's stages have 384)."""


class SliceError(ValueError):
    """A layer selection that does not make a valid slice; the message names `--layers`."""


def slice_text_config(
    layers=RELEASE_LAYERS,
    engram_vocab: int = ENGRAM_VOCAB,
    compressed_vocab: int = 0,
    widths: dict | None = None,
    dspark_experts: int | None = None,
) -> dict:
    """Flat text fields of the slice of release layers `layers` (sorted, distinct).

    compressed_vocab: the tokenizer's engram compressed vocabulary (the writer fills it in);
    widths: text fields to override (reduced widths for CPU tests), None for the release's;
    dspark_experts: None for no DSpark head, else the routed experts of its stages (the
    model's own count keeps them full width).
    Raises SliceError when the slice breaks a rule of the config or of decoder replay."""
    full = flash_text_config()
    n_full = full["num_hidden_layers"]
    ids = [int(v) for v in layers]
    if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= n_full:
        raise SliceError(f"--layers {ids}: need distinct, sorted release layers in [0, {n_full})")
    pos = {layer: j for j, layer in enumerate(ids)}
    text = dict(full)
    text["num_hidden_layers"] = len(ids)
    ratios = full["compress_ratios"]
    text["compress_ratios"] = [ratios[layer] for layer in ids] + ratios[n_full:]
    for key in ROLE_LISTS:
        text[key] = [pos[layer] for layer in full[key] if layer in pos]
    text["candidate_source_layer_id"] = pos.get(full["candidate_source_layer_id"], -1)
    text.update(widths or {})
    text["engram_vocab_size"] = int(engram_vocab)
    text["engram_compressed_vocab_size"] = int(compressed_vocab)
    text["engram_num_embeddings"] = engram_table_rows(text) if text["engram_layer_ids"] else []
    if dspark_experts is not None:
        n = int(dspark_experts)
        if not text["num_experts_per_tok"] <= n <= text["n_routed_experts"]:
            raise SliceError(
                f"--dspark-experts {n}: need num_experts_per_tok ({text['num_experts_per_tok']})"
                f" <= n <= n_routed_experts ({text['n_routed_experts']})"
            )
        text.update(dspark_config(text))
        if n != text["n_routed_experts"]:
            text["dspark_n_routed_experts"] = n
    try:
        cfg = DeepseekV41Config.from_dict(text)
    except ValueError as e:
        raise SliceError(f"--layers {ids}: {e}") from e
    last = max(cfg.kv_source_layer_ids)
    if last != cfg.decoder_start or cfg.candidate_source_layer_id not in (-1, last):
        raise SliceError(
            f"--layers {ids}: the decoder starts at slice layer {cfg.decoder_start} "
            f"(num_hidden_layers // 2), which must be the last kv source (slice layer {last}) "
            "and the candidate source"
        )
    return text


def slice_config(text: dict) -> dict:
    """The released config.json layout around the slice's text fields, declared text-only with
    `vision_n_layers: 0` at the top level (SGLang reads it before vision_config's layer count):
    the slice has no vision tower, so no server may build one or treat an image token apart."""
    return {**release_config(text, flash_vision_config()), "vision_n_layers": 0}


def layer_table(cfg: DeepseekV41Config, layers) -> list:
    """One row per slice layer: slice id, release id, ratio, role and its notes."""
    rows = []
    for j, layer in enumerate(layers):
        notes = []
        if cfg.role(j) in (REUSE, REINDEX):
            notes.append(f"reads {cfg.source_layer_of(j)}")
        if j == cfg.decoder_start:
            notes.append("decoder start")
        if j == cfg.candidate_source_layer_id:
            notes.append("candidate source")
        if cfg.uses_candidates(j):
            notes.append("candidate pool")
        if j in cfg.engram_layer_ids:
            notes.append("Engram")
        rows.append((j, int(layer), cfg.ratio(j), cfg.role(j), ", ".join(notes)))
    return rows


def missing_roles(cfg: DeepseekV41Config) -> list:
    """What of {SWA, Full-2, Reuse-2, Full-1, Reuse-1, Reindex, Engram} the slice lacks."""
    held = {(cfg.role(j), cfg.ratio(j)) for j in range(cfg.num_hidden_layers)}
    want = [(SWA, 0), (FULL, 2), (REUSE, 2), (FULL, 1), (REUSE, 1), (REINDEX, 1)]
    out = [f"{role}-{ratio}" for role, ratio in want if (role, ratio) not in held]
    return out + ([] if cfg.engram_layer_ids else ["Engram"])
