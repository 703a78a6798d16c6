"""Attention supervision: the decoder's first global layer is shown where each answer digit is.

Training from scratch, the answer's loss alone leaves a long plateau: nothing rewards looking
at the asked fact until the look already pays. While the decoder attends densely, an auxiliary
loss on the decoder's Full layer (the candidate source, whose entries are token positions)
pulls its attention at every digit-answering row towards the fact's digit the row must write:

    aux = - sum over digit rows r of log(mean_h p[r, h, source(r)] + EPS)

p: the layer's softmax mass on each main-KV entry (training.dense_attention), heads averaged.
The sources come with the example (training.examples). The indexers then learn where to look
from this attention by distillation, and sparse training proceeds without the auxiliary loss.
"""

from __future__ import annotations

import torch

EPS = 1e-6


def supervision_loss(p: torch.Tensor, rows: torch.Tensor, sources: torch.Tensor):
    """p fp32 [T, H, N] (rows of the decoder from its floor), rows int64 [R] indices into T,
    sources int64 [R] entry ids -> (summed loss with graph, mean supervised mass as a float)."""
    mass = p[rows, :, sources].mean(-1)  # [R]
    return -torch.log(mass + EPS).sum(), float(mass.detach().mean())
