"""The presets' DSpark draft head, as SGLang 0.5.23 reads it (docs/speculative.md).

- SGLang's own parser takes the written config.json: the checkpoint bundles a DSpark head,
  gamma / verify width / mask token / Markov rank / target layers come out as declared;
- SGLang's `DeepseekV4ForCausalLMDSpark`, built on CPU from the checkpoint's config, loads the
  checkpoint's `mtp.*` tensors through its own `load_weights` with every parameter written
  (parameters are filled with a byte sentinel first; a row still all sentinel was not loaded)
  and no name it does not know: released FP8/FP4 format (flash-mini) with and without the
  confidence head, and the dense tiny checkpoint;
- this package's text loaders skip the head; bad `dspark_*` values are refused by name.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("sglang.srt.models.deepseek_v4_dspark")

from intree_cpu import cpu_build_shims, init_sglang_cpu, released_tensors  # noqa: E402

from sglang_dsv41.config import DeepseekV41Config  # noqa: E402
from sglang_dsv41.weights.dspark_manifest import (  # noqa: E402
    DSparkHead,
    dspark_release_tensors,
    dspark_tensors,
)

SENTINEL = 0xAB
NOT_IN_CHECKPOINT = ("attn.k_scale", "attn.v_scale")  # RadixAttention's KV scales


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sglang_dsv41.tools.make_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("dspark") / "tiny", "tiny")


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    from sglang_dsv41.tools.release_checkpoint import write_flash_mini

    return write_flash_mini(tmp_path_factory.mktemp("dspark") / "mini")


@pytest.fixture(scope="module")
def sglang_ready(tiny):
    from sglang.srt.runtime_context import restore_context, snapshot_context

    saved = snapshot_context()
    init_sglang_cpu(tiny)
    yield
    restore_context(saved)


@pytest.mark.parametrize("which", ["tiny", "mini"])
def test_sglang_parses_the_head(which, tiny, mini):
    from sglang.srt.speculative.dspark_components.dspark_config import (
        checkpoint_bundles_dspark_draft,
        parse_dspark_draft_config,
        resolve_runtime_config,
    )

    from sglang_dsv41.sglang.hf_config import DeepseekV41HFConfig

    path = tiny if which == "tiny" else mini
    raw = json.loads((path / "config.json").read_text())
    hf = DeepseekV41HFConfig(**raw)
    cfg = hf.dsv41()
    head = DSparkHead.of(cfg)
    assert checkpoint_bundles_dspark_draft(hf)
    parsed = parse_dspark_draft_config(draft_hf_config=hf)
    assert parsed.gamma == head.block_size == 5
    assert parsed.markov_rank == head.markov_rank > 0
    assert parsed.mask_token_id == head.noise_token_id < cfg.vocab_size
    assert tuple(parsed.target_layer_ids) == head.target_layer_ids
    assert len(head.target_layer_ids) == 3
    rt = resolve_runtime_config(
        draft_hf_config=hf, speculative_num_draft_tokens=None, target_vocab_size=cfg.vocab_size
    )
    assert (rt.gamma, rt.verify_num_draft_tokens) == (5, 6)


def load_head(model, path) -> tuple:
    """Fill `model`'s parameters with the sentinel, load the checkpoint's mtp.* tensors through
    SGLang's `load_weights` -> (parameters not fully written, the loader's warnings)."""
    import sglang.srt.models.deepseek_v4_dspark as ds

    with torch.no_grad():
        for p in model.parameters():
            p.data.reshape(-1).view(torch.uint8).fill_(SENTINEL)
    warnings = []

    class Catch(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    handler = Catch()
    ds.logger.addHandler(handler)
    model.post_load_weights = lambda *a, **k: None  # mHC weight caches: CUDA kernels
    try:
        model.load_weights(
            iter([(n, t) for n, t in released_tensors(path) if n.startswith("mtp.")])
        )
    finally:
        ds.logger.removeHandler(handler)
    unwritten = []
    for name, p in model.named_parameters():
        b = p.data.contiguous().reshape(-1).view(torch.uint8)
        rows = b.reshape(-1, p.element_size() * (p.shape[-1] if p.dim() > 1 else 1))
        if (rows == SENTINEL).all(-1).any() and not name.endswith(NOT_IN_CHECKPOINT):
            unwritten.append(name)
    return unwritten, warnings


def build_draft(model_cls, config, quant, dtype: torch.dtype):
    """SGLang's draft class built on CPU with default dtype `dtype` (intree_cpu's shims)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with cpu_build_shims():
            return model_cls(config, quant)
    finally:
        torch.set_default_dtype(saved)


def _build_and_load(path, quantized: bool):
    """SGLang's draft model built from the checkpoint's config, loaded from its mtp.* tensors ->
    (model, parameters not fully written, the loader's warnings)."""
    import sglang.srt.models.deepseek_v4_dspark as ds

    from sglang_dsv41.sglang.intree_config import intree_config, intree_quant_config

    cfg = DeepseekV41Config.from_hf(str(path))
    quant = intree_quant_config(cfg) if quantized else None
    config = intree_config(cfg)
    if not quantized:  # the dense presets leave the routing method to its default
        config.topk_method = "noaux_tc"
    dtype = torch.bfloat16 if quantized else torch.float32
    model = build_draft(ds.DeepseekV4ForCausalLMDSpark, config, quant, dtype)
    return (model, *load_head(model, path))


@pytest.mark.parametrize("ragged", ["static", "compact"])
def test_sglang_loads_the_released_head(mini, sglang_ready, ragged, monkeypatch):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", ragged)
    model, unwritten, warnings = _build_and_load(mini, quantized=True)
    assert unwritten == [] and warnings == []
    assert len(model.stages) == 3 and model.gamma == 5
    assert (model.confidence_head is not None) == (ragged == "compact")
    # every stored mtp.* tensor is one the manifest lists, and the reverse
    stored = {n for n, _ in released_tensors(mini) if n.startswith("mtp.")}
    assert stored == set(dspark_release_tensors(DeepseekV41Config.from_hf(str(mini))))


def test_sglang_loads_the_dense_head(tiny, sglang_ready, monkeypatch):
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    model, unwritten, warnings = _build_and_load(tiny, quantized=False)
    cfg = DeepseekV41Config.from_hf(str(tiny))
    assert cfg.hc_mult == 1  # no mHC: SGLang's layers still build (unused) mixing weights
    assert [n for n in unwritten if ".hc_" not in n] == [] and warnings == []
    stored = {n: (tuple(t.shape), t.dtype) for n, t in released_tensors(tiny)}
    head = {n: v for n, v in stored.items() if n.startswith("mtp.")}
    assert head == {n: (s, d) for n, (s, d) in dspark_tensors(cfg).items()}
    assert model.stages[0].main_proj.weight.shape == (cfg.hidden_size, 3 * cfg.hidden_size)


def test_text_loaders_skip_the_head(tiny):
    from sglang_dsv41.reference import load_reference

    model = load_reference(tiny)
    assert not any(n.startswith("mtp.") for n, _ in model.named_parameters())


@pytest.mark.parametrize(
    "change, key",
    [
        ({"dspark_markov_rank": None}, "dspark_markov_rank: missing"),
        ({"dspark_noise_token_id": 512}, "dspark_noise_token_id 512"),
        ({"dspark_target_layer_ids": [3, 12]}, "dspark_target_layer_ids: [12]"),
        ({"dspark_block_size": 0}, "dspark_block_size 0"),
    ],
)
def test_bad_head_is_refused_by_name(tiny, change, key):
    raw = json.loads((tiny / "config.json").read_text())
    nested = raw.pop("text_config")
    text = {**raw, **nested}
    text.update({k: v for k, v in change.items() if v is not None})
    for k, v in change.items():
        if v is None:
            text.pop(k)
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        DSparkHead.of(DeepseekV41Config.from_dict(text))
