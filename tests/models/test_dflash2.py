"""DFlash2 drafter: identity initialization, block-local convolutions, the selector walk."""

from __future__ import annotations

import pytest
import torch
from testkit import tiny_drafter, tiny_qwen3

from dflash_train.models.config import DrafterConfig, resolve_drafter_config
from dflash_train.models.drafter import DFlashDrafter
from dflash_train.models.kinds.dflash2 import grouped_causal_conv, selector_walk
from dflash_train.models.target import Target

OPTIONS = {"conv_group_size": 16, "selector_rank": 8, "selector_top_k": 5}

B = 4


@pytest.fixture(scope="module")
def target():
    return Target(tiny_qwen3(num_layers=4))


def _dflash2(target, perturb=True, **kw):
    kw.setdefault("target_layer_ids", [0, 2])
    return tiny_drafter(target, num_layers=2, block_size=B, kind="dflash2", options=OPTIONS,
                        **kw) if perturb else _fresh(target, **kw)


def _fresh(target, **kw):
    cfg = DrafterConfig(num_hidden_layers=2, block_size=B, kind="dflash2", options=OPTIONS, **kw)
    cfg = resolve_drafter_config(cfg, target.facts, mask_token_id=target.facts.vocab_size - 1)
    return DFlashDrafter(cfg), cfg


def _inputs(blocks=3, seq=7, seed=1, h=64, n=2):
    g = torch.Generator().manual_seed(seed)
    q = blocks * B
    embeds = torch.randn(1, q, h, generator=g)
    features = torch.randn(1, seq, n * h, generator=g)
    block_pos = torch.arange(seq, seq + q).unsqueeze(0)
    ctx_pos = torch.arange(seq).unsqueeze(0)
    own_block = torch.arange(q) // B
    mask = torch.cat([torch.ones(q, seq, dtype=torch.bool), own_block[:, None] == own_block[None, :]], dim=1)
    return embeds, features, block_pos, ctx_pos, mask[None, None]


def test_config_validation():
    with pytest.raises(ValueError, match="drafter.kind"):
        DrafterConfig(kind="dflash3").validate()
    with pytest.raises(ValueError, match="drafter.options.conv_group_size"):
        DrafterConfig(kind="dflash2", hidden_size=60, options={"conv_group_size": 16}).validate()
    with pytest.raises(ValueError, match="drafter.options.selector_top_k"):
        DrafterConfig(kind="dflash2", options={"selector_top_k": 0}).validate()
    with pytest.raises(ValueError, match="not options of drafter.kind=dflash2"):
        DrafterConfig(kind="dflash2", options={"markov_rank": 8}).validate()


def test_identity_initialized_dflash2_equals_dflash(target):
    """An untrained DFlash2 (taps [1, 0], projections 0) on DFlash's weights gives DFlash's outputs exactly."""
    dflash, _ = tiny_drafter(target, num_layers=2, block_size=B, target_layer_ids=[0, 2])
    two, _ = _fresh(target, target_layer_ids=[0, 2])
    missing = two.load_state_dict(dflash.state_dict(), strict=False)
    assert not missing.unexpected_keys
    assert all("conv" in k or "candidate_selector" in k for k in missing.missing_keys)
    args = _inputs()
    torch.testing.assert_close(two(*args), dflash(*args), rtol=0, atol=0)
    # and the walk's greedy path is DFlash's argmax (successor codebook 0: S = U)
    hidden = two(*args)[:, 1:B]
    logits = hidden @ target.lm_head_weight.t()
    path, _, _ = selector_walk(two.candidate_selector, hidden, logits, torch.tensor([3]))
    assert torch.equal(path, logits.argmax(-1))
    # the check can fail: a non-identity tap changes the output
    with torch.no_grad():
        two.layers[0].mlp_conv.base_kernel[1, 1] += 0.5
    assert not torch.allclose(two(*args), dflash(*args))


def test_conv_taps_stay_inside_blocks(target):
    """Perturbing block 1 leaves blocks 0 and 2 unchanged (each block sees only itself) and changes block 1."""
    drafter, _ = _dflash2(target, target_layer_ids=[0, 2])
    embeds, *rest = _inputs()
    base = drafter(embeds, *rest)
    moved = embeds.clone()
    moved[:, B:2 * B] += torch.randn(1, B, 64)
    out = drafter(moved, *rest)
    torch.testing.assert_close(out[:, :B], base[:, :B], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 2 * B:], base[:, 2 * B:], rtol=0, atol=0)
    assert (out[:, B:2 * B] - base[:, B:2 * B]).abs().max() > 1e-3
    # the test fails for a convolution that runs over the whole row (taps crossing blocks)
    drafter.conv_segment = lambda q: q
    crossed = drafter(moved, *rest)
    assert (crossed[:, 2 * B:] - base[:, 2 * B:]).abs().max() > 1e-4


def test_grouped_causal_conv_against_loop():
    g = torch.Generator().manual_seed(0)
    b, q, h, K, groups, seg = 2, 8, 12, 3, 3, 4
    x, delta, base = torch.randn(b, q, h, generator=g), torch.randn(b, q, K, groups, generator=g), torch.randn(K, h, generator=g)
    ref = torch.zeros(b, q, h)
    for t in range(q):
        for o in range(K):
            if t % seg - o < 0:  # the tap would leave the block: it reads zero
                continue
            coef = base[o] + delta[:, t, o].repeat_interleave(h // groups, dim=-1)
            ref[:, t] += coef * x[:, t - o]
    torch.testing.assert_close(grouped_causal_conv(x, delta, base, seg), ref)


def _slow_walk(selector, hidden, logits, anchor, temperature, seed):
    """One batch row, one slot at a time, scores by explicit sums over the rank."""
    A, Bk, P = selector.predecessor_codebook, selector.successor_codebook, selector.hidden_projection.weight
    g = torch.Generator().manual_seed(seed)
    prev, path, qs = int(anchor), [], []
    for j in range(hidden.shape[0]):
        order = sorted(range(logits.shape[-1]), key=lambda v: -float(logits[j, v]))[: selector.top_k]
        ph = P @ hidden[j]
        s = torch.tensor([float(logits[j, c]) + sum(float(A[prev, r] * ph[r] * Bk[c, r]) for r in range(len(ph)))
                          for c in order])
        if temperature > 0:
            q = torch.softmax(s / temperature, -1)
            idx = int(torch.multinomial(q[None], 1, generator=g)[0, 0])
            qs.append(q)
        else:
            idx = int(s.argmax())
        prev = order[idx]
        path.append(prev)
    return path, qs


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_selector_walk_against_slow_loop(target, temperature):
    drafter, _ = _dflash2(target)
    sel = drafter.candidate_selector
    with torch.no_grad():
        sel.successor_codebook.normal_(std=0.5)  # the pairwise term must matter
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, B - 1, 64, generator=g)
    logits = torch.randn(1, B - 1, 128, generator=g) * 2
    with torch.no_grad():
        path, cands, q = selector_walk(sel, hidden, logits, torch.tensor([7]), temperature,
                                       torch.Generator().manual_seed(5))
        ref_path, ref_q = _slow_walk(sel, hidden[0], logits[0], 7, temperature, 5)
    assert path[0].tolist() == ref_path
    assert path[0].tolist() != logits[0].argmax(-1).tolist() or temperature > 0  # the selector changed the path
    if temperature > 0:
        torch.testing.assert_close(q[0], torch.stack(ref_q), rtol=1e-5, atol=1e-6)
    else:
        assert q is None
    assert cands.shape == (1, B - 1, 5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selector_walk_of_a_batch_of_long_blocks_against_slow_loop(target, seed):
    """Batched rows and 15 slots (B = 16): every row's greedy path from the precomputed transition
    scores equals its own slow walk (a walk that picked a candidate from the wrong predecessor
    row, or mixed rows of the batch, would leave it after a few slots)."""
    drafter, _ = _dflash2(target)
    sel = drafter.candidate_selector
    with torch.no_grad():
        sel.successor_codebook.normal_(std=1.0)
    g = torch.Generator().manual_seed(10 + seed)
    hidden, logits = torch.randn(3, 15, 64, generator=g), torch.randn(3, 15, 128, generator=g)
    anchors = torch.tensor([7, 0, 99])
    with torch.no_grad():
        path = selector_walk(sel, hidden, logits, anchors)[0]
        refs = [_slow_walk(sel, hidden[i], logits[i], int(anchors[i]), 0.0, 0)[0] for i in range(3)]
    assert path.tolist() == refs
    assert path.tolist() != logits.argmax(-1).tolist()  # the pairwise term changed some pick
