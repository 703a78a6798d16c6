"""make_checkpoint: tensors equal the manifest, same seed -> same bytes, the tokenizer loads with
AutoTokenizer and renders chats as deepseek-recipe does, config round-trips, greedy decoding of
the reference does not collapse."""

import json
import time

import pytest
import torch

from sglang_dsv41.config import DeepseekV41Config, preset
from sglang_dsv41.manifest import tensor_manifest
from sglang_dsv41.tools.make_checkpoint import (
    checkpoint_config,
    checkpoint_manifest,
    main,
    write_checkpoint,
)
from sglang_dsv41.tools.tokenizer import BOS, DSML, EOS, SPECIAL_TOKENS, train_tokenizer
from sglang_dsv41.weights.dspark_manifest import KEYS as DSPARK_KEYS
from sglang_dsv41.weights.dspark_manifest import dspark_tensors

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # square\n\n\tindent\r\n",
    "Prix: 19,99 €; 中文测试；emoji 🙂 and ü ß — 12345 3.14159",
    "  leading and trailing spaces  ",
    "<think>literal tags</think> and <｜User｜> inside text",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="module")
def hf_tok(ckpt):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ckpt))


def test_tensors_equal_manifest(ckpt):
    from safetensors.torch import load_file

    cfg = DeepseekV41Config.from_hf(ckpt)
    want = checkpoint_manifest(cfg)
    got = load_file(str(ckpt / "model.safetensors"))
    assert sorted(got) == sorted(want)
    text = tensor_manifest(cfg, dense_dtype=getattr(torch, cfg.torch_dtype))
    assert set(want) - set(text) == set(dspark_tensors(cfg))  # the DSpark head, mtp.*
    assert all(n.startswith("mtp.") for n in dspark_tensors(cfg))
    for name, (shape, dtype) in want.items():
        assert tuple(got[name].shape) == shape, name
        assert got[name].dtype == dtype, name
        assert torch.isfinite(got[name]).all(), name


def test_init_scales(ckpt):
    from safetensors.torch import load_file

    w = load_file(str(ckpt / "model.safetensors"))
    hid = preset("tiny").hidden_size
    assert abs(w["embed.weight"].std().item() - 1.0) < 0.05
    assert abs(w["head.weight"].std().item() * hid**0.5 - 1.0) < 0.05
    assert abs(w["layers.3.attn.wq_b.weight"].std().item() * 32**0.5 - 1.0) < 0.05
    norms = [v for k, v in w.items() if k.endswith("norm.weight")]
    assert all((v - 1).abs().max() < 0.3 for v in norms)
    assert all(w[k].abs().max() < 0.5 for k in w if k.endswith(("attn_sink", "gate.bias")))


def test_every_manifest_tensor_has_an_init_rule():
    """mHC and Engram (off in the presets) must not break make_checkpoint when turned on."""
    from sglang_dsv41.presets import tiny
    from sglang_dsv41.tools.make_checkpoint import random_weights

    cfg = DeepseekV41Config.from_dict(
        {
            **tiny(),
            "num_hidden_layers": 4,
            "compress_ratios": [0, 2, 1, 1],
            "kv_source_layer_ids": [1, 2],
            "index_source_layer_ids": [1, 2],
            "candidate_source_layer_id": 2,
            "hc_mult": 2,
            "engram_layer_ids": [1],
            "engram_num_embeddings": [64],
            "engram_max_ngram_size": 3,
            "engram_n_heads": 2,
            "engram_head_dim": 16,
            "engram_vocab_size": 512,
        }
    )
    w = random_weights(cfg, 0)
    assert sorted(w) == sorted(tensor_manifest(cfg))
    assert all(torch.isfinite(v).all() for v in w.values())
    if not any("hc_attn_base" in k for k in w) or not any("engram" in k for k in w):
        pytest.skip("the manifest does not list mHC / Engram tensors yet")


def test_same_seed_same_bytes(ckpt, tmp_path):
    again = write_checkpoint(tmp_path / "again", "tiny", seed=0)
    for f in FILES:
        assert (ckpt / f).read_bytes() == (again / f).read_bytes(), f
    other = write_checkpoint(tmp_path / "seed1", "tiny", seed=1)
    assert (ckpt / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (ckpt / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_config_round_trips(ckpt):
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV41ForCausalLM"]
    assert raw["model_type"] == "deepseek_v41"
    assert raw["vision_n_layers"] == 0 and raw["tie_word_embeddings"] is False
    want = preset("tiny")
    for flat in (False, True):
        got = (
            DeepseekV41Config.from_hf(ckpt)
            if not flat
            else DeepseekV41Config.from_dict(checkpoint_config("tiny", text_config=False))
        )
        for field in want.__dataclass_fields__:
            if field != "extra":
                assert getattr(got, field) == getattr(want, field), (flat, field)
        assert got.extra.get("vision_n_layers") == 0
        assert set(got.extra) - set(want.extra) == {"vision_n_layers", *DSPARK_KEYS}


def test_cli_errors(tmp_path, capsys):
    for argv, msg in [
        (["--preset", "huge", "--out", str(tmp_path / "a")], "unknown preset 'huge'"),
        (["--preset", "flash", "--out", str(tmp_path / "b")], "GB of random weights"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "full")])
    assert "not empty" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "full"), "--force", "--seed", "3"]) == 0
    assert (tmp_path / "full" / "model.safetensors").exists()
    assert (tmp_path / "full" / "keep.txt").exists()


def test_tokenizer_training_fast_and_exact():
    t0 = time.time()
    tok = train_tokenizer(512)
    assert time.time() - t0 < 10
    assert tok.get_vocab_size(with_added_tokens=True) == 512
    assert tok.to_str() == train_tokenizer(512).to_str()
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(100)


def test_tokenizer_loads_offline(hf_tok):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(hf_tok, PreTrainedTokenizerFast)
    assert len(hf_tok) == 512
    assert hf_tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == SPECIAL_TOKENS
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == (BOS, EOS, EOS)
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (0, 1, 1)
    assert hf_tok.convert_tokens_to_ids("<｜Assistant｜>") == 4
    assert hf_tok.convert_tokens_to_ids("<｜read_url｜>") == 23
    assert hf_tok.convert_tokens_to_ids(DSML) == 24 and 24 not in hf_tok.all_special_ids
    assert hf_tok.decode([24, 3, 4], skip_special_tokens=True) == DSML  # tool markup survives
    for text in TEXTS:
        ids = hf_tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < 512 for i in ids)
        assert hf_tok.decode(ids) == text
        assert hf_tok.encode(text)[0] == 0  # bos prepended by default
    assert len(hf_tok.encode(TEXTS[0], add_special_tokens=False)) < len(TEXTS[0]) * 0.6


def test_chat_template_renders(hf_tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Why?"},
    ]
    text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<｜begin▁of▁sentence｜><｜System｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>"
        "Hello!<｜end▁of▁sentence｜><｜User｜>Why?<｜Assistant｜></think>"
    )
    think = hf_tok.apply_chat_template(
        msgs[1:2], tokenize=False, add_generation_prompt=True, thinking=True
    )
    assert think.startswith("<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (")
    assert think.endswith("\n\n<｜User｜>Hi<｜Assistant｜><think>")
    ids = hf_tok.apply_chat_template(
        msgs[1:2], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert ids[:2] == [0, 3] and ids[-2:] == [4, 6]  # one bos, <User> ... <Assistant></think>


CONVERSATIONS = [
    [("user", "Hello")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "How are you?")],
    [("system", "A"), ("system", "B"), ("user", "Hi"), ("system", "C"), ("user", "x")],
    [("user", "Hi"), ("user", "again")],
    [("user", "Hi"), ("assistant", "a"), ("assistant", "b")],
    [("user", "12 apples, 3 pears"), ("latest_reminder", "be kind")],
    [("latest_reminder", "rem"), ("user", "more")],
]


@pytest.mark.parametrize(
    "thinking,effort", [(False, None), (True, None), (True, "low"), (True, "max")]
)
def test_chat_template_matches_deepseek_recipe(hf_tok, thinking, effort):
    """SGLang renders deepseek_v41 chats with deepseek-recipe; the Jinja template must agree."""
    recipe = pytest.importorskip("deepseek_recipe")
    kinds = {
        "system": recipe.SystemMessage,
        "user": recipe.UserMessage,
        "assistant": recipe.AssistantMessage,
        "latest_reminder": recipe.LatestReminderMessage,
    }
    encoding = recipe.DeepseekV41Encoding().with_special_tokens(
        recipe.SpecialTokens(image="<｜deepseek_image｜>")
    )
    with_tok = encoding.with_tokenizer(recipe.Tokenizer.from_str(hf_tok.backend_tokenizer.to_str()))
    kw = {"thinking": thinking, **({"reasoning_effort": effort} if effort else {})}
    for conv in CONVERSATIONS:
        conversation = recipe.Conversation(
            [kinds[r](c) for r, c in conv], thinking_mode=thinking, reasoning_effort=effort
        )
        msgs = [{"role": r, "content": c} for r, c in conv]
        text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
        assert text == encoding.render_conversation(conversation).prompt, conv
        ids = hf_tok.apply_chat_template(
            msgs, tokenize=True, add_generation_prompt=True, return_dict=False, **kw
        )
        assert ids == with_tok.encode(conversation), conv


def test_deepseek_recipe_encodes_tool_requests(hf_tok):
    """Tools render with ｜DSML｜ markup, which recipe encodes only from the added vocabulary."""
    recipe = pytest.importorskip("deepseek_recipe")
    request = recipe.ChatCompletionRequest(
        {
            "model": "DeepSeek-V4.1-Flash",
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ],
        }
    )
    converted = request.convert(recipe.ConversionOptions())
    ids = (
        recipe.DeepseekV41Encoding()
        .with_tokenizer(recipe.Tokenizer.from_str(hf_tok.backend_tokenizer.to_str()))
        .encode(converted.conversation)
    )
    assert ids[0] == 0 and 24 in ids


def test_greedy_decoding_does_not_collapse(ckpt):
    """32 greedy tokens from the reference after a random prompt: many distinct tokens."""
    try:
        from sglang_dsv41.reference import load_reference
    except ImportError as e:
        pytest.skip(f"reference model not importable: {e}")
    model = load_reference(ckpt)
    gen = torch.Generator().manual_seed(7)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: intra-op threads cost ~6x on a 2-core machine
    try:
        for n in (8, 40):
            prompt = torch.randint(len(SPECIAL_TOKENS), 512, (n,), generator=gen).tolist()
            out = model.generate(prompt, 32)
            assert len(out) == 32
            assert len(set(out)) >= 16, out
            assert max(out.count(t) for t in set(out)) <= 6, out
    finally:
        torch.set_num_threads(threads)
