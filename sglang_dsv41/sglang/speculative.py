"""Speculative decoding as the `dsv41` backend serves it: the verify width, read once.

SGLang's speculative workers (DSpark for V4.1, docs/speculative.md) run the target model over
`speculative_num_draft_tokens` rows per request in one TARGET_VERIFY forward and keep only the
accepted rows. The pool sizes its per-request state for that width (serving/buffers.py: rings of
W + width - 1 records, width // 2 + 1 pending pairs), so rejected rows need no undo; the backend
refuses a verify wider than the pool was sized for.
"""

from __future__ import annotations


def served_verify_width() -> int:
    """Rows per request of the server's target-verify forwards: speculative_num_draft_tokens
    under a speculative algorithm, else 1 (SGLang's published config; 1 outside a server)."""
    try:
        from sglang.srt.runtime_context import get_spec

        spec = get_spec()
        algorithm = spec.speculative_algorithm
        width = spec.speculative_num_draft_tokens
    except Exception:  # no published server config (tests, tools)
        return 1
    if not algorithm or not width:
        return 1
    return int(width)


def verify_width_of(forward_batch) -> int:
    """Rows per request of a TARGET_VERIFY batch (host int, no sync: a shape). Uniform blocks
    only: SGLang's ragged (compact) verify layouts give requests different widths."""
    B = int(forward_batch.req_pool_indices.numel())
    T = int(forward_batch.out_cache_loc.numel())
    layout = getattr(forward_batch.spec_info, "ragged_verify_layout", None)
    if layout is not None or B == 0 or T % B:
        raise NotImplementedError(
            f"dsv41 backend: target verify with {T} rows over {B} requests"
            f"{' in a ragged layout' if layout is not None else ''}; only uniform blocks are "
            "served (SGLANG_RAGGED_VERIFY_MODE=static, its default)"
        )
    return T // B


def check_verify_width(width: int, pool_width: int) -> None:
    if width > pool_width:
        raise RuntimeError(
            f"dsv41 backend: a target verify of {width} rows per request, but the pool was "
            f"sized for {pool_width} (speculative_num_draft_tokens at startup); rejected rows "
            "would overwrite state later rows read"
        )
