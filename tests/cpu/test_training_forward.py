"""The training forward is the oracle's forward with gradients: equal values, straight-through
quantization, the indexer learning from distillation only, and a loss that training reduces."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.config import preset
from sglang_dsv41.layers.quant import quant_index, quant_main_kv, quant_swa_kv
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.tools.tokenizer import train_tokenizer
from sglang_dsv41.training.curriculum import Stage, step_samples
from sglang_dsv41.training.dense_attention import dense_attention, selected_mass
from sglang_dsv41.training.distill import group_kl, indexer_loss
from sglang_dsv41.training.examples import TaskTokenizer
from sglang_dsv41.training.filler import TRAIN_SOURCE, filler_lines
from sglang_dsv41.training.forward import SPARSE, Modes, train_forward
from sglang_dsv41.training.init import initial_model, trainable_parameters
from sglang_dsv41.training.straight_through import ste_index, ste_main_kv, ste_swa_kv
from sglang_dsv41.training.train import run_step

DENSE = Modes(True, True)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return initial_model(preset("tiny"), seed=3)


@pytest.mark.parametrize("L,floor", [(200, 0), (300, 300 - 16), (333, 120)])
def test_sparse_training_forward_equals_the_oracle(model, L, floor):
    ids = torch.randint(2, 512, (L,), generator=torch.Generator().manual_seed(L))
    with torch.no_grad():
        ref = model.forward(ids, replay_floor=floor)
    rows = torch.arange(max(floor, L - 24), L)
    got, _ = train_forward(model, ids, rows, floor, SPARSE)
    assert torch.equal(got.detach(), ref[rows])


def test_dense_attention_is_sparse_attention_over_every_visible_entry():
    g = torch.Generator().manual_seed(0)
    T, H, D, W, N = 7, 3, 32, 4, 9
    q, k_swa, main = (torch.randn(*s, generator=g) for s in ((T, H, D), (T, W, D), (N, D)))
    swa_ok = torch.rand(T, W, generator=g) > 0.3
    main_ok = torch.rand(T, N, generator=g) > 0.4
    sink = torch.randn(H, generator=g)
    o, p_main = dense_attention(q, k_swa, swa_ok, main, main_ok, sink, 0.2)
    want = sparse_attention(q, k_swa, swa_ok, main.expand(T, N, D), main_ok, sink, 0.2)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-6)
    p_top = selected_mass(q, k_swa, swa_ok, main.expand(T, N, D), main_ok, sink, 0.2)
    torch.testing.assert_close(p_main, p_top, rtol=1e-5, atol=1e-7)
    assert (p_main[~main_ok[:, None, :].expand(T, H, N)] == 0).all()


def test_straight_through_values_and_gradient():
    cfg = preset("tiny")
    x = torch.randn(5, 64, requires_grad=True)
    for ste, ref in ((ste_swa_kv, quant_swa_kv), (ste_index, quant_index)):
        y = ste(x)
        assert torch.equal(y, ref(x.detach()))
        (g,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(g, torch.ones_like(x))
    assert torch.equal(ste_main_kv(cfg, x), quant_main_kv(cfg, x.detach()))


def test_indexer_learns_from_distillation_only(model):
    ids = torch.randint(2, 512, (150,), generator=torch.Generator().manual_seed(1))
    rows = torch.arange(140, 150)
    for modes in (DENSE, SPARSE):
        logits, st = train_forward(model, ids, rows, 0, modes)
        lm_grads = torch.autograd.grad(logits.sum(), list(model.parameters()), allow_unused=True)
        kl_grads = torch.autograd.grad(
            indexer_loss(st.groups), list(model.parameters()), allow_unused=True
        )
        for (name, _), g_lm, g_kl in zip(model.named_parameters(), lm_grads, kl_grads, strict=True):
            in_indexer = ".indexer." in name
            assert (g_lm is None or not g_lm.any()) or not in_indexer, name
            assert (g_kl is None or not g_kl.any()) or in_indexer, name
        assert any(g is not None and g.any() for g in kl_grads)


def test_group_kl_is_zero_when_the_indexer_agrees():
    mass = torch.tensor([[0.0, 2.0, 6.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    ok = torch.tensor([[True, True, True, False], [True, True, False, False]])
    logits = torch.log(torch.tensor([[1e-9, 0.25, 0.75, 1.0], [0.5, 0.5, 1.0, 1.0]]))
    assert float(group_kl(logits, ok, mass)) == pytest.approx(0.0, abs=1e-6)
    assert float(group_kl(torch.zeros(2, 4), ok, mass)) > 0.1
    assert float(group_kl(torch.zeros(2, 4), ok, torch.zeros(2, 4))) == 0.0


def test_a_few_steps_reduce_the_loss():
    torch.manual_seed(0)
    cfg = preset("tiny")
    model = initial_model(cfg, seed=0)
    tt = TaskTokenizer(train_tokenizer(cfg.vocab_size))
    filler = filler_lines(TRAIN_SOURCE)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=3e-3, betas=(0.9, 0.95))
    losses = []
    for step, modes in enumerate([DENSE] * 12 + [SPARSE] * 12):
        stage = Stage("t", 1, (64, 128), (2, 3), (1, 3), modes)
        samples = step_samples(0, step, stage, 4, tt, filler, cfg.sliding_window)
        opt.zero_grad()
        figs = run_step(model, samples, "cpu", supervise=1.0 if modes is DENSE else 0.0)
        opt.step()
        losses.append(figs["lm"] + figs["kl"] + figs["sup"])
        assert (figs["sup"] > 0) == (modes is DENSE)
    assert sum(losses[-4:]) / 4 < 0.6 * sum(losses[:4]) / 4, losses


def test_sparse_supervision_raises_the_mass_on_the_digits_source():
    """In sparse mode the decoder's Full layer keeps its attention mass per entry (0 off its
    top-k, with graph); descending the supervision alone raises the mass on the sources."""
    from sglang_dsv41.reference.model import load_reference
    from sglang_dsv41.training.supervision import supervision_loss

    model = load_reference("sglang_dsv41/data/retrieval")  # trained: its top-k holds the fact
    cfg = model.cfg
    # trained, it puts ~all its mass on the source: soften the layer so there is room to climb
    model.layers[cfg.decoder_start].attn.scale *= 0.1
    tt = TaskTokenizer(train_tokenizer(cfg.vocab_size))
    stage = Stage("t", 1, (256, 400), (2, 3), (1, 1), SPARSE)
    (s,) = step_samples(5, 0, stage, 1, tt, filler_lines(TRAIN_SOURCE), cfg.sliding_window)
    ex, layer = s.example, cfg.decoder_start
    digit = [i for i, src in enumerate(ex.sources) if src >= 0]
    sup_rows = torch.tensor([ex.rows[i] - s.floor for i in digit])
    sources = torch.tensor([ex.sources[i] for i in digit])
    ids, rows = torch.tensor(ex.ids), torch.tensor(ex.rows)
    opt = torch.optim.SGD(trainable_parameters(model), lr=0.05)
    masses = []
    for _ in range(6):
        _, st = train_forward(model, ids, rows, s.floor, SPARSE, frozenset({layer}))
        kept, topk = st.kept[layer], st.topk[layer]
        off = torch.ones_like(kept[:, 0], dtype=torch.bool)
        off.scatter_(1, topk.clamp_min(0), False)
        assert float((kept.detach().abs().sum(1) * off).max()) == 0.0
        assert float(kept.detach().sum(-1).max()) <= 1.0 + 1e-5
        sup, mass = supervision_loss(kept, sup_rows, sources)
        masses.append(mass)
        opt.zero_grad()
        sup.backward()
        opt.step()
    assert 0.0 < masses[0] < masses[-1], masses
