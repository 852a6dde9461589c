"""The clip folded into the fused AdamW (``optim.clip_gradients``) against the plain reference:
``clip_grad_norm_`` followed by an unfused AdamW step."""

import pytest
import torch

from dflash_train.train.optim import clip_gradients


def _model_and_grads(grad_size: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * grad_size
    return model


def _copy(model):
    twin = _model_and_grads(0.0)
    twin.load_state_dict(model.state_dict())
    for p, q in zip(twin.parameters(), model.parameters()):
        p.grad = q.grad.clone()
    return twin


@pytest.mark.parametrize("grad_size", [10.0, 1e-3])  # clipped, and under the limit (divisor 1)
def test_fused_clip_matches_clip_then_step(grad_size):
    folded = _model_and_grads(grad_size)
    reference = _copy(folded)
    fused = torch.optim.AdamW(folded.parameters(), lr=1e-2, fused=True)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        norm = clip_gradients(fused, folded.parameters(), 1.0)
        expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        assert fused.grad_scale.item() == pytest.approx(max(expected.item() / 1.0, 1.0), rel=1e-5)
        fused.step()
        plain.step()
        torch.testing.assert_close(norm, expected)
        for p, q in zip(folded.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)  # the clipped gradients stay
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    moved = sum((p - q).abs().sum() for p, q in zip(folded.parameters(), _model_and_grads(0.0).parameters()))
    assert moved > 1e-3


def test_skipped_step_leaves_weights_with_the_fold():
    model = _model_and_grads(10.0)
    before = [p.detach().clone() for p in model.parameters()]
    fused = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    clip_gradients(fused, model.parameters(), 1.0)
    fused.found_inf = torch.tensor(1.0)
    fused.step()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)


def test_unfused_optimizer_clips_the_gradients_themselves():
    model = _model_and_grads(10.0)
    norm = clip_gradients(torch.optim.AdamW(model.parameters(), lr=1e-2), model.parameters(), 1.0)
    assert norm > 1.0
    after = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert after == pytest.approx(1.0, rel=1e-4)
