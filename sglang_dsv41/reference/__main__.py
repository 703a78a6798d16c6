"""python -m sglang_dsv41.reference --model DIR (--input-ids 1,2,3 | --prompt TEXT)
       --max-new-tokens N [--no-replay]

Greedy generation by full recomputation with the oracle; prints one JSON object with
`output_ids` and `text`.
"""

import json
import sys
import time

import torch

from sglang_dsv41.tools.cli import cli_parser


def load_tokenizer(model_dir: str):
    """The checkpoint's tokenizer, the class its tokenizer_config.json names.

    Without a `config`, AutoTokenizer parses config.json to learn the model type, and
    transformers, which does not know `deepseek_v41` (only the SGLang plugin registers it),
    warns on every load that the checkpoint is of another type. The model type only matters
    when tokenizer_config.json names no class, which V4.1 checkpoints do, so an empty config
    is passed instead."""
    from transformers import AutoTokenizer, PretrainedConfig

    return AutoTokenizer.from_pretrained(model_dir, config=PretrainedConfig())


def main(argv=None) -> int:
    ap = cli_parser("sglang_dsv41.reference", __doc__)
    ap.add_argument("--model", required=True, help="checkpoint directory")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input-ids", help="comma-separated token ids")
    src.add_argument("--prompt", help="text, tokenized with the checkpoint's tokenizer")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument(
        "--no-replay",
        action="store_true",
        help="full forward instead of decoder SWA bounded replay",
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: 1 for models narrower than 1024, "
        "where more threads only add contention; else torch's default)",
    )
    args = ap.parse_args(argv)

    from sglang_dsv41.reference import load_reference

    model = load_reference(args.model, getattr(torch, args.dtype))
    if args.threads or model.cfg.hidden_size < 1024:
        torch.set_num_threads(args.threads or 1)
    tok = None
    if args.prompt is not None:
        tok = load_tokenizer(args.model)
        ids = tok.encode(args.prompt)
    else:
        try:
            ids = [int(t) for t in args.input_ids.split(",") if t.strip()]
        except ValueError:
            ap.error("--input-ids must be comma-separated integers")
    if not ids:
        ap.error("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < model.cfg.vocab_size]
    if bad:
        ap.error(f"token ids out of range [0, {model.cfg.vocab_size}): {bad[:5]}")
    t0 = time.time()
    out = model.generate(ids, args.max_new_tokens, replay=not args.no_replay)
    result = {"input_len": len(ids), "output_ids": out, "seconds": round(time.time() - t0, 3)}
    if tok is None:
        try:
            tok = load_tokenizer(args.model)
        except Exception:
            tok = None
    result["text"] = tok.decode(out) if tok is not None else None
    json.dump(result, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
