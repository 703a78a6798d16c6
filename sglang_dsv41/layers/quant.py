"""The quantization points of V4.1 attention, as fake-quant (encode then decode) on float tensors.

The oracle passes values through the same codecs a cache applies, so a serving path that stores
real records reads back exactly these values.
    swa_kv      -> V41 (e4m3, UE8M0 per 32)
    main_kv     -> V41_FP4 (e2m1, e4m3 per 16), or V41 when kv_cache_dtype_main == "fp8"
    index_k / indexer query -> index-K encoding (e2m1, UE8M0 per 32)
"""

import torch

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.kv.records import Layout, fake_quant


def quant_swa_kv(x: torch.Tensor) -> torch.Tensor:
    return fake_quant(Layout.V41, x.float())


def quant_main_kv(cfg: DeepseekV41Config, x: torch.Tensor) -> torch.Tensor:
    return fake_quant(cfg.main_kv_layout, x.float())


def quant_index(x: torch.Tensor) -> torch.Tensor:
    return fake_quant(Layout.INDEX_K, x.float())
