"""A small byte-level BPE tokenizer with the V4.1 special tokens and a DeepSeek chat template.

Trained at checkpoint-creation time with the `tokenizers` library on the text shipped in
`sglang_dsv41/data/*.txt`; vocab size exactly `cfg.vocab_size` (special tokens + 256 byte symbols
+ merges). Special tokens come first so their ids match the config: 0 = bos, 1 = eos (also pad);
then the (non-special) added token `｜DSML｜` that tool calls need.

Files written by `save_tokenizer(dir, ...)`: `tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json`; they load offline with `transformers.AutoTokenizer.from_pretrained`
as a PreTrainedTokenizerFast. Plain `encode` prepends bos (as DeepSeek's tokenizers do);
`add_special_tokens=False` does not.

The chat template renders conversations the way the `deepseek-recipe` package's V4.1 encoder
does (SGLang renders `deepseek_v41` chats with it), for system / user / assistant /
latest_reminder messages in thinking and non-thinking mode:

    <bos>[<System>[effort line]{system}]<User>{user}<Assistant></think>{answer}<eos>...
    ...<User>{user}<Assistant></think>          (non-thinking generation prompt)
    ...<User>{user}<Assistant><think>           (thinking: `thinking=True` or `enable_thinking`)

Thinking mode opens with `<System>Reasoning Effort: N (range 1-100, ...)\\n\\n` (N = 75, or 50 for
`reasoning_effort="low"`, 100 for "max", or an integer budget) before the first system content;
past answers drop their reasoning; consecutive user messages join with a blank line. Tool calls
and tool results are not rendered by the template (SGLang uses the recipe encoder for those).

Determinism: the same corpus gives the same `tokenizer.json` bytes (checked across processes,
also with RAYON_NUM_THREADS=8: the trainer sorts its alphabet and breaks merge ties by token id);
training still defaults to one thread, which costs nothing at this size (~0.1 s).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
SPECIAL_TOKENS = [
    BOS,
    EOS,
    "<｜System｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜latest_reminder｜>",
    "<｜deepseek_image｜>",
    "<｜image｜>",
    "<｜box｜>",
    "<｜/box｜>",
    "<｜point｜>",
    "<｜/point｜>",
    "<｜polygon｜>",
    "<｜/polygon｜>",
    "<｜ref｜>",
    "<｜/ref｜>",
    "<｜action｜>",
    "<｜query｜>",
    "<｜authority｜>",
    "<｜domain｜>",
    "<｜title｜>",
    "<｜read_url｜>",
]
"""Special tokens in id order: SPECIAL_TOKENS[i] has id i."""
DSML = "｜DSML｜"
"""Tool-call markup token, id len(SPECIAL_TOKENS): deepseek-recipe refuses to encode a request
with tools unless it is in the added vocabulary. Not special, so decoding with
`skip_special_tokens=True` keeps it and tool-call parsers still see the markup."""

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

CHAT_TEMPLATE = (
    "{%- set thinking = thinking | default(enable_thinking | default(false)) -%}"
    "{%- set effort = reasoning_effort | default(none) -%}"
    "{%- if effort is none or effort in ['high', 'xhigh', 'medium'] -%}{%- set effort = 75 -%}"
    "{%- elif effort == 'low' -%}{%- set effort = 50 -%}"
    "{%- elif effort == 'max' -%}{%- set effort = 100 -%}{%- endif -%}"
    "{{- bos_token -}}"
    "{%- if thinking and messages | length > 0 -%}"
    "{{- '<｜System｜>Reasoning Effort: ' ~ effort ~ ' (range 1-100, the higher the value, "
    "the more thorough the reasoning)\\n\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(prev='') -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- set content = message['content'] if message['content'] is string else '' -%}"
    "{%- if role == 'system' or role == 'developer' -%}"
    "{%- if not (loop.first and thinking) -%}{{- '<｜System｜>' -}}{%- endif -%}"
    "{{- content -}}"
    "{%- elif role == 'user' -%}"
    "{%- if ns.prev == 'user' -%}{{- '\\n\\n' -}}{%- else -%}{{- '<｜User｜>' -}}{%- endif -%}"
    "{{- content -}}"
    "{%- elif role == 'latest_reminder' -%}"
    "{{- '<｜latest_reminder｜>' ~ content -}}"
    "{%- elif role == 'assistant' -%}"
    "{{- '<｜Assistant｜></think>' ~ content ~ eos_token -}}"
    "{%- endif -%}"
    "{%- set ns.prev = role -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<｜Assistant｜>' ~ ('<think>' if thinking else '</think>') -}}"
    "{%- endif -%}"
)


def corpus_texts(data_dir: Path = DATA_DIR) -> list:
    """The shipped training text: every `*.txt` under data_dir, in sorted name order."""
    files = sorted(Path(data_dir).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no tokenizer corpus (*.txt) in {data_dir}")
    return [f.read_text(encoding="utf-8") for f in files]


def train_tokenizer(vocab_size: int, texts: list = None):
    """Train a byte-level BPE with SPECIAL_TOKENS first; returns a `tokenizers.Tokenizer` of
    exactly vocab_size entries. Raises ValueError if vocab_size cannot be reached exactly."""
    # Single-threaded training: set before `tokenizers` builds its thread pool.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    floor = len(SPECIAL_TOKENS) + 1 + 256
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} < {floor} (added tokens + 256 bytes)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS + [AddedToken(DSML, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts if texts is not None else corpus_texts(), trainer=trainer)
    # The trainer marks every added token special; DSML must not be (see DSML).
    spec = json.loads(tok.to_str())
    for entry in spec["added_tokens"]:
        entry["special"] = entry["content"] != DSML
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    got = tok.get_vocab_size(with_added_tokens=True)
    if got != vocab_size:
        raise ValueError(
            f"tokenizer has {got} entries, wanted vocab_size {vocab_size} "
            "(the corpus is too small for that many merges)"
        )
    for i, s in enumerate(SPECIAL_TOKENS + [DSML]):
        if tok.token_to_id(s) != i:
            raise ValueError(f"special token {s!r} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def tokenizer_config(model_max_length: int) -> dict:
    """`tokenizer_config.json` contents (PreTrainedTokenizerFast, bos added, eos = pad)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "additional_special_tokens": SPECIAL_TOKENS[2:],
        "added_tokens_decoder": {
            str(i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": s != DSML,
            }
            for i, s in enumerate(SPECIAL_TOKENS + [DSML])
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


PAD_TOKEN = "<unused_{}>"
"""Vocabulary entries past the trained ones (`pad_vocab`): ASCII, so each decodes to itself."""


def pad_vocab(tok, vocab_size: int):
    """`tok` with entries PAD_TOKEN.format(id) appended to its BPE vocabulary up to exactly
    vocab_size. No merge produces them, so encoding never emits them; every id decodes to a
    distinct text (a released model's vocabulary, 129,280 entries, over a corpus too small to
    train that many merges)."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    start = tok.get_vocab_size(with_added_tokens=True)
    for i in range(start, vocab_size):
        name = PAD_TOKEN.format(i)
        if name in vocab:
            raise ValueError(f"pad token {name!r} is already in the trained vocabulary")
        vocab[name] = i
    out = Tokenizer.from_str(json.dumps(spec))
    if out.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise ValueError(f"padded tokenizer has {out.get_vocab_size()} entries, not {vocab_size}")
    return out


def save_tokenizer(
    out_dir, vocab_size: int, model_max_length: int, trained_size: int | None = None
) -> None:
    """Train and write tokenizer.json, tokenizer_config.json, special_tokens_map.json.
    trained_size: train that many entries and pad the rest (`pad_vocab`); None trains all."""
    out = Path(out_dir)
    tok = train_tokenizer(trained_size or vocab_size)
    if trained_size:
        tok = pad_vocab(tok, vocab_size)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(out / "tokenizer_config.json", tokenizer_config(model_max_length))
    _write_json(
        out / "special_tokens_map.json",
        {
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "additional_special_tokens": SPECIAL_TOKENS[2:],
        },
    )


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
