"""The indexer's loss: KL distillation of the attention's mass over compressed entries.

For one index source and one query row t (DeepSeek-V3.2's lightning-indexer objective):
    p[t, s] = mass[t, s] / sum_s mass[t, s]       attention mass of the group (heads and the
                                                   layers that attend this selection, summed)
    L[t]    = KL(p[t] || softmax_s(I[t, s]))       over the slots s the row may see
The loss of a forward is the mean of L over the rows with some mass and some visible slot,
then the mean over index sources. Only the indexer's parameters carry a gradient here
(training.attention detaches its inputs and the mass).
"""

from __future__ import annotations

import torch

MIN_MASS = 1e-6
"""Rows whose group put less total mass on the compressed entries are left out (nothing to
learn from: the attention looked at the window or the sink only)."""


def group_kl(index_logits: torch.Tensor, ok: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """index_logits fp32 [T, S], ok bool [T, S], mass fp32 [T, S] -> scalar mean KL over the
    rows that have visible slots and mass >= MIN_MASS (0 when there are none)."""
    mass = torch.where(ok, mass, torch.zeros_like(mass))
    total = mass.sum(-1)  # [T]
    rows = ok.any(-1) & (total >= MIN_MASS)
    if not bool(rows.any()):
        return index_logits.sum() * 0.0
    logits = index_logits[rows].masked_fill(~ok[rows], float("-inf"))
    logq = torch.log_softmax(logits, dim=-1)  # [R, S]
    p = mass[rows] / total[rows, None]
    pos = p > 0
    kl = torch.where(pos, p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p))
    return kl.sum(-1).mean()


def indexer_loss(groups: dict) -> torch.Tensor:
    """groups: index source -> DistillGroup -> scalar mean of group_kl over the groups."""
    losses = [group_kl(g.index_logits, g.ok, g.mass) for g in groups.values()]
    return torch.stack(losses).mean()


def per_layer_kl(groups: dict) -> dict:
    """index source -> float KL (for the training log)."""
    with torch.no_grad():
        return {i: float(group_kl(g.index_logits, g.ok, g.mass)) for i, g in groups.items()}
