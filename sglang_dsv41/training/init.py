"""The starting weights of a training run: the random checkpoint's, residual writes scaled.

`tools.make_checkpoint.random_weights(cfg, seed)` (each tensor seeded by its name), then the
matrices that write into the residual stream (attn.wo_b, every expert's w2) multiplied by
(2 n_layers)^-1/2, the GPT-2 rule, so the residual starts near the embedding's scale and
early training is stable.
"""

from __future__ import annotations

from sglang_dsv41.config import DeepseekV41Config
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.tools.make_checkpoint import random_weights

RESIDUAL_WRITES = (".attn.wo_b.weight", ".w2.weight")


def initial_model(cfg: DeepseekV41Config, seed: int, device="cpu") -> ReferenceModel:
    """A ReferenceModel in fp32 on `device` holding the seeded starting weights."""
    weights = random_weights(cfg, seed)
    scale = (2 * cfg.num_hidden_layers) ** -0.5
    for name, t in weights.items():
        if name.endswith(RESIDUAL_WRITES):
            weights[name] = t * scale
    model = ReferenceModel(cfg)
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    return model.to(device).train()


def trainable_parameters(model: ReferenceModel) -> list:
    """Every parameter but the router biases (steered by load, not by gradient)."""
    return [p for n, p in model.named_parameters() if not n.endswith("gate.bias")]


def count_parameters(model: ReferenceModel) -> int:
    return sum(p.numel() for p in model.parameters())
