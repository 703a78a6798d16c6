"""Server defaults under `--speculative-algorithm DSPARK` on CUDA (docs/speculative.md 6).

The DSpark draft is SGLang's `DeepseekV4ForCausalLMDSpark` on SGLang's own V4 pool and `dsv4`
backend (sglang/dspark_draft.py), which stock SGLang configures through its V4 defaults; those
run for its architecture name only, so the two settings the draft's pool needs are declared here:

    page_size                         256: SGLang's V4 pool asserts it on CUDA, and one page size
                                      serves both runners (this package's pool takes any even
                                      page); a different page the user set is refused by name
    speculative_draft_kv_cache_dtype  fp8_e4m3, the draft's records as stock SGLang keeps them
                                      (left `auto` it would follow this package's target, whose
                                      `auto` gives the draft a bf16 pool); a value the user set
                                      is kept
Both fields are model-overridable (`resolvable_fields(ServerArgs)`). A pure rule over the
resolved arguments (no SGLang import), applied by sglang/server_defaults.py.
"""

from __future__ import annotations

DSPARK = "DSPARK"
"""SGLang's name of the algorithm (`--speculative-algorithm DSPARK`)."""
DRAFT_PAGE = 256
DRAFT_KV_DTYPE = "fp8_e4m3"


def dspark_server_defaults(cfg) -> dict:
    """cfg: SGLang's resolving view of the server arguments -> the fields to set."""
    algorithm = getattr(cfg, "speculative_algorithm", None)
    if str(algorithm or "").upper() != DSPARK or getattr(cfg, "device", None) != "cuda":
        return {}
    page = int(getattr(cfg, "page_size", None) or 1)
    if page not in (1, DRAFT_PAGE):
        raise ValueError(
            f"--page-size {page}: under --speculative-algorithm DSPARK the draft runs on "
            f"SGLang's V4 KV pool, which needs --page-size {DRAFT_PAGE} (one page size serves "
            "the target and the draft)"
        )
    out = {"page_size": DRAFT_PAGE}
    if getattr(cfg, "speculative_draft_kv_cache_dtype", None) in (None, "auto"):
        out["speculative_draft_kv_cache_dtype"] = DRAFT_KV_DTYPE
    return out
