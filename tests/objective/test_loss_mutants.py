"""What ``objective/loss.py`` must compute, pinned where mutation testing found it unchecked (issue 60.4).

mutmut over ``loss.py`` left mutants alive in paths the other objective tests never take: the
kind's low-rank logit bias (its loss, its gradients summed over several chunks, a backward scale
other than 1), mixed dtypes (an fp32 drafter against a wider lm_head, which the ``.to`` casts
exist for), the kind's hooks in ``dflash_loss`` (what they are given, their picks and total), a
per-block weighting or a kl target with ``last_position``, ``LossOptions``' bounds,
``acceptance_stats``' counters, and the ``torch.compile`` wrapper's static shapes and
one-warning eager fallback (reached here with a fake ``torch.compile``: nothing is compiled).
Every check is against a plain reference: full float64 logits, autograd on the unchunked form,
or counts by hand. Which mutants are equivalent, and why: ``docs/results/mutation/loss-triage.md``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dflash_train.objective.loss as loss_mod
from dflash_train.objective.kinds import KindLoss, KindTerms
from dflash_train.objective.loss import (
    LossOptions,
    acceptance_stats,
    chunked_loss_parts,
    dflash_loss,
    reference_loss,
)

V, H, R = 7, 5, 3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _full_ce(hidden, lm_head, labels, bias_in=None, bias_head=None):
    """Per-row CE of the full float64 logits (and the logits), with the bias if given."""
    logits = hidden.double() @ lm_head.double().t()
    if bias_in is not None:
        logits = logits + bias_in.double() @ bias_head.double().t()
    return torch.logsumexp(logits, -1) - logits.gather(1, labels.unsqueeze(1)).squeeze(1), logits


def _leaf(t, grad=True):
    return t.detach().clone().requires_grad_(grad)


# --- the logit bias, dtypes, chunks, backward scale ------------------------------------------------

@pytest.mark.parametrize("dtypes", [
    # hidden, lm_head, bias_in, bias_head
    (torch.float32, torch.float64, torch.float64, torch.float64),
    (torch.float64, torch.float64, torch.float32, torch.float64),
])
def test_biased_loss_and_gradients_over_chunks_match_autograd_on_full_logits(dtypes):
    """Loss, argmax, weights used and all three gradients (hidden, bias_in, bias_head) of a loss
    split in three chunks, scaled by 2.5 before backward, against autograd on full logits."""
    dt_h, dt_w, dt_bi, dt_bh = dtypes
    g = _gen(0)
    n = 6
    hidden = torch.randn(n, H, generator=g, dtype=torch.float64)
    lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    bias_in = torch.randn(n, R, generator=g, dtype=torch.float64)
    bias_head = torch.randn(V, R, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (n,), generator=g)
    weights = torch.rand(n, generator=g, dtype=torch.float64) + 0.1

    ref_h, ref_bi, ref_bh = _leaf(hidden), _leaf(bias_in), _leaf(bias_head)
    ce, logits = _full_ce(ref_h, lm_head, labels, ref_bi, ref_bh)
    ref_total = (weights * ce).sum()
    (2.5 * ref_total).backward()

    h, bi, bh = _leaf(hidden.to(dt_h)), _leaf(bias_in.to(dt_bi)), _leaf(bias_head.to(dt_bh))
    total, argmax, used, cands = chunked_loss_parts(h, lm_head.to(dt_w), labels, weights, LossOptions(chunk_size=2),
                                                    bias=(bi, bh))
    (2.5 * total).backward()

    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(total.double(), ref_total.detach(), **tol)
    assert torch.equal(argmax, logits.argmax(-1))
    torch.testing.assert_close(used.double(), weights, **tol)
    assert not used.requires_grad  # the weights used are detached
    assert cands.dtype == torch.long and cands.shape == (0,)  # no top-k asked: an empty id tensor
    for got, ref in ((h, ref_h), (bi, ref_bi), (bh, ref_bh)):
        assert got.grad is not None and got.grad.dtype == got.dtype
        torch.testing.assert_close(got.grad.double(), ref.grad, **tol)


@pytest.mark.parametrize("trained", ["bias_in", "bias_head"])
def test_bias_alone_requiring_grad_still_gets_its_gradient(trained):
    """The hidden states frozen and only one bias factor trainable: the chunks must still compute
    the gradients (want_grad is any of the three requiring grad)."""
    g = _gen(1)
    n = 4
    hidden = torch.randn(n, H, generator=g, dtype=torch.float64)
    lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    bias = {"bias_in": torch.randn(n, R, generator=g, dtype=torch.float64),
            "bias_head": torch.randn(V, R, generator=g, dtype=torch.float64)}
    labels = torch.randint(0, V, (n,), generator=g)
    weights = torch.rand(n, generator=g, dtype=torch.float64) + 0.1

    ref = {k: _leaf(v, k == trained) for k, v in bias.items()}
    ce, _ = _full_ce(hidden, lm_head, labels, ref["bias_in"], ref["bias_head"])
    (weights * ce).sum().backward()

    got = {k: _leaf(v, k == trained) for k, v in bias.items()}
    total, *_ = chunked_loss_parts(hidden, lm_head, labels, weights, LossOptions(chunk_size=3),
                                   bias=(got["bias_in"], got["bias_head"]))
    total.backward()
    torch.testing.assert_close(got[trained].grad, ref[trained].grad, rtol=1e-4, atol=1e-5)


def test_chunked_loss_parts_refusals_name_what_is_wrong():
    g = _gen(2)
    lm_head = torch.randn(V, H, generator=g)
    with pytest.raises(ValueError, match="lm_head"):
        chunked_loss_parts(torch.randn(4, H), lm_head.clone().requires_grad_(), torch.zeros(4, dtype=torch.long),
                           torch.ones(4))
    with pytest.raises(ValueError, match="^7 rows are not whole blocks of 3 positions"):
        chunked_loss_parts(torch.randn(7, H), lm_head, torch.zeros(7, dtype=torch.long), torch.ones(7),
                           LossOptions(weighting="reach", block=3))


# --- LossOptions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, key", [
    ({"weighting": "nope"}, "objective.weighting"),
    ({"weighting": "reach", "block": 0}, "block"),
    ({"weighting": "dpace", "block": 0}, "block"),
    ({"dpace_alpha": 1.5}, "objective.dpace_alpha"),
    ({"dpace_alpha": -0.1}, "objective.dpace_alpha"),
    ({"targets": (("ce", 1.0), ("nope", 1.0))}, r"objective.targets: unknown \['nope'\]"),
])
def test_loss_options_refuse_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        LossOptions(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"weighting": "reach", "block": 1}, {"weighting": "dpace", "block": 1},
    {"dpace_alpha": 0.0}, {"dpace_alpha": 1.0}, {"targets": (("ce", 0.5), ("kl", 0.25), ("tv", 0.25))},
])
def test_loss_options_accept_the_bounds(kwargs):
    LossOptions(**kwargs)


# --- acceptance_stats -------------------------------------------------------------------------------

def test_acceptance_stats_by_hand():
    correct = torch.tensor([[[1, 1, 0], [0, 1, 0]],
                            [[1, 1, 1], [1, 0, 0]]], dtype=torch.bool)
    valid = torch.tensor([[[1, 1, 1], [1, 1, 0]],
                          [[1, 1, 1], [1, 0, 0]]], dtype=torch.bool)
    keep = torch.tensor([[True, True], [True, False]])
    stats = acceptance_stats(correct, valid, keep)
    assert torch.equal(stats.correct_per_position, torch.tensor([3.0, 3.0, 1.0]))
    assert torch.equal(stats.valid_per_position, torch.tensor([4.0, 3.0, 2.0]))
    # leading correct: 2, 0, 3, (1: not kept) -> (1 + 2) + (1 + 0) + (1 + 3)
    assert torch.equal(stats.accepted_sum, torch.tensor(8.0))
    assert torch.equal(stats.blocks, torch.tensor(3.0))



def test_acceptance_stats_move_the_keep_mask_to_the_counts_device():
    """On a GPU the anchors' keep mask can be on another device than the counts; the meta device forces
    that path on a CPU (a meta tensor times a CPU one raises, as a CUDA one times a CPU one does)."""
    correct = torch.ones(2, 2, 3, dtype=torch.bool, device="meta")
    stats = acceptance_stats(correct, correct, torch.tensor([[True, True], [True, False]]))
    assert {t.device.type for t in vars(stats).values()} == {"meta"}

# --- dflash_loss with a kind's hooks -----------------------------------------------------------------

ROWS, A, B = 2, 2, 4


def _blocks(seed, last_position=None, rows=ROWS, num_blocks=A):
    g = _gen(seed)
    hidden = torch.randn(rows, num_blocks * B, H, generator=g, dtype=torch.float64)
    lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    labels = torch.randint(0, V, (rows, num_blocks, B), generator=g)
    weights = torch.rand(rows, num_blocks, B, generator=g, dtype=torch.float64) + 0.1
    valid = torch.rand(rows, num_blocks, B, generator=g) > 0.3
    end = B if last_position is None else last_position + 1
    return hidden, lm_head, labels, weights, valid, end


def _selected(hidden, labels, weights, valid, end):
    rows, num_blocks = labels.shape[:2]
    sel = hidden.view(rows, num_blocks, B, -1)[:, :, 1:end]
    return sel, labels[:, :, 1:end], weights[:, :, 1:end], valid[:, :, 1:end]


class _Drafter:
    def __init__(self, seed):
        g = _gen(seed)
        self.proj = torch.randn(H, R, generator=g, dtype=torch.float64).requires_grad_()
        self.bias_head = torch.randn(V, R, generator=g, dtype=torch.float64).requires_grad_()


class _SpyKind(KindTerms):
    """A kind with every hook: a bias from the drafter and the inputs, top-2 candidates, its own
    term (0.1 * the sum of the argmax ids: reads the chunk's outputs) and picks of its own."""

    name = "spy"

    def __init__(self):
        self.seen = {}

    def logit_bias(self, drafter, inputs):
        self.seen["inputs"] = inputs
        return inputs.hidden @ drafter.proj, drafter.bias_head

    def top_k(self, drafter):
        return 2

    def terms(self, drafter, inputs, chunk, options):
        self.seen["chunk"], self.seen["options"] = chunk, options
        return KindLoss(0.1 * chunk.argmax.double().sum(), picks=(chunk.argmax + 1) % V, logs={"spy": 1})


def test_kind_hooks_get_the_sliced_inputs_and_their_bias_terms_and_picks_count():
    last = 2
    hidden, lm_head, labels, weights, valid, end = _blocks(3, last)
    anchor_ids = torch.randint(0, V, (ROWS, A), generator=_gen(4))
    sel, lab, w, val = _selected(hidden, labels, weights, valid, end)

    ref_drafter, ref_hidden = _Drafter(5), _leaf(hidden)
    ref_sel = ref_hidden.view(ROWS, A, B, H)[:, :, 1:end].reshape(-1, H)
    ce, logits = _full_ce(ref_sel, lm_head, lab.reshape(-1), ref_sel @ ref_drafter.proj, ref_drafter.bias_head)
    argmax = logits.argmax(-1)
    ref_total = (w.reshape(-1) * ce).sum() + 0.1 * argmax.double().sum()
    (1.5 * ref_total).backward()

    kind, drafter, h = _SpyKind(), _Drafter(5), _leaf(hidden)
    out = dflash_loss(h, lm_head, labels, weights, valid, LossOptions(chunk_size=3), last_position=last, kind=kind,
                      drafter=drafter, anchor_ids=anchor_ids, kind_options={"k": 1})
    (1.5 * out.weighted_ce).backward()

    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.weighted_ce.double(), ref_total.detach(), **tol)
    inputs = kind.seen["inputs"]
    assert torch.equal(inputs.hidden.detach(), sel.reshape(-1, H))
    assert torch.equal(inputs.labels, lab.reshape(-1))
    assert torch.equal(inputs.valid, val.reshape(-1))
    assert torch.equal(inputs.prev, torch.cat([anchor_ids.unsqueeze(-1), labels[:, :, 1:end - 1]], -1).reshape(-1))
    chunk = kind.seen["chunk"]
    assert torch.equal(chunk.argmax, argmax)
    assert torch.equal(chunk.candidates, logits.topk(2, -1).indices)
    torch.testing.assert_close(chunk.used.double(), w.reshape(-1), **tol)
    assert kind.seen["options"] == {"k": 1}
    assert torch.equal(out.valid, val)
    assert torch.equal(out.correct, (((argmax + 1) % V).view_as(lab) == lab) & val)
    assert out.logs == {"spy": 1}
    for got, ref in ((h, ref_hidden), (drafter.proj, ref_drafter.proj), (drafter.bias_head, ref_drafter.bias_head)):
        torch.testing.assert_close(got.grad, ref.grad, **tol)


class _RefusingKind(KindTerms):
    name = "refusing"

    def logit_bias(self, drafter, inputs):
        raise AssertionError("logit_bias without anchor_ids")

    def top_k(self, drafter):
        raise AssertionError("top_k without anchor_ids")

    def terms(self, drafter, inputs, chunk, options):
        raise AssertionError("terms without anchor_ids")


def test_a_kind_without_anchor_ids_adds_nothing():
    hidden, lm_head, labels, weights, valid, end = _blocks(6)
    sel, lab, w, val = _selected(hidden, labels, weights, valid, end)
    out = dflash_loss(hidden, lm_head, labels, weights, valid, LossOptions(chunk_size=4), kind=_RefusingKind(),
                      drafter=object())
    ce, logits = _full_ce(sel.reshape(-1, H), lm_head, lab.reshape(-1))
    torch.testing.assert_close(out.weighted_ce.double(), (w.reshape(-1) * ce).sum(), rtol=1e-5, atol=1e-6)
    assert torch.equal(out.correct, (logits.argmax(-1).view_as(lab) == lab) & val)
    assert out.logs is None


def test_per_block_weighting_uses_the_limited_block_not_the_callers():
    """``dflash_loss`` sets the block to the positions that reach the lm_head (here 2 of B-1 = 3),
    whatever block the caller's options carried: reach weighting then groups rows by 2."""
    last = 2
    hidden, lm_head, labels, weights, valid, end = _blocks(7, last, rows=3, num_blocks=1)
    sel, lab, w, _ = _selected(hidden, labels, weights, valid, end)
    out = dflash_loss(hidden, lm_head, labels, weights, valid, LossOptions(chunk_size=4, weighting="reach", block=3),
                      last_position=last)
    ref = reference_loss(sel, lm_head, lab, w, None, reach=True) * w.sum()
    torch.testing.assert_close(out.weighted_ce.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target_dtype", [torch.float64, torch.float32])
def test_kl_target_with_limited_positions_reads_the_matching_target_states(target_dtype):
    """``target_hidden`` [rows, A, B-1, h] is cut to the positions that reach the lm_head, so each
    row's KL is against the target's distribution at that row's own position (also when its dtype
    is not the lm_head's)."""
    last = 1
    hidden, lm_head, labels, weights, valid, end = _blocks(8, last)
    target_hidden = torch.randn(ROWS, A, B - 1, H, generator=_gen(9), dtype=torch.float64)
    sel, lab, w, _ = _selected(hidden, labels, weights, valid, end)
    opts = LossOptions(chunk_size=2, targets=(("ce", 0.5), ("kl", 0.5)))
    out = dflash_loss(hidden, lm_head, labels, weights, valid, opts, target_hidden=target_hidden.to(target_dtype),
                      last_position=last)

    ce, logits = _full_ce(sel.reshape(-1, H), lm_head, lab.reshape(-1))
    p = torch.softmax(target_hidden[:, :, :end - 1].reshape(-1, H) @ lm_head.t(), -1)
    kl = (p * (p.log() - torch.log_softmax(logits, -1))).sum(-1)
    ref = (w.reshape(-1) * (0.5 * ce + 0.5 * kl)).sum()
    torch.testing.assert_close(out.weighted_ce.double(), ref, rtol=1e-5, atol=1e-6)


# --- the torch.compile wrapper (a fake torch.compile: nothing is compiled) ---------------------------

def _add(a, b):
    return a + b


def test_torch_compile_wrapper_asks_for_static_shapes(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append((fn, kw)) or fn)
    wrapper = loss_mod._CompiledOrEager(_add)
    assert seen == [(_add, {"dynamic": False})]
    assert wrapper(1, 2) == 3


@pytest.mark.parametrize("error, text", [(RuntimeError("first line\nsecond line"), "RuntimeError: first line"),
                                         (ValueError(), "ValueError: ")])
def test_torch_compile_failure_warns_once_then_runs_eager(monkeypatch, error, text):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    wrapper = loss_mod._CompiledOrEager(_add)

    def broken(*args):
        raise error

    wrapper.compiled = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert wrapper(1, 2) == 3
        assert wrapper(2, 3) == 5
    assert [str(w.message) for w in caught] == [f"compiled loss chunk failed ({text}); using the eager chunk"]
    assert wrapper.compiled is None


@pytest.mark.parametrize("compile_option", [False, True])
def test_compile_option_decides_whether_chunks_go_through_torch_compile(monkeypatch, compile_option):
    calls = []

    def fake_compile(fn, **kw):
        def run(*args):
            calls.append(args[0].shape[0])
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    g = _gen(10)
    hidden, lm_head = torch.randn(5, H, generator=g), torch.randn(V, H, generator=g)
    labels, weights = torch.randint(0, V, (5,), generator=g), torch.rand(5, generator=g)
    loss_mod._compiled.cache_clear()
    try:
        total, *_ = chunked_loss_parts(hidden, lm_head, labels, weights,
                                       LossOptions(chunk_size=2, compiled=compile_option))
    finally:
        loss_mod._compiled.cache_clear()
    assert calls == ([2, 2, 1] if compile_option else [])
    ce, _ = _full_ce(hidden, lm_head, labels)
    torch.testing.assert_close(total.double(), (weights.double() * ce).sum(), rtol=1e-5, atol=1e-5)
