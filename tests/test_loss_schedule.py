import pytest
import torch
import torch.nn.functional as F

from transduce.train.loss import label_smoothed_nll
from transduce.train.schedule import learning_rate


def test_label_smoothing_matches_definition_and_excludes_padding():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 4, 7), torch.tensor([[4, 5, 6, 0], [1, 2, 0, 0]])
    eps = 0.1
    loss, nll = label_smoothed_nll(logits, target, eps, pad_id=0)
    lp = logits.log_softmax(-1)
    expected = 0.0
    expected_nll = 0.0
    for b in range(2):
        for t in range(4):
            if target[b, t] == 0:
                continue
            q = torch.full((7,), eps / 7)
            q[target[b, t]] += 1 - eps
            expected += -(q * lp[b, t]).sum()
            expected_nll += -lp[b, t, target[b, t]]
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected_nll)
    # agrees with PyTorch's own label smoothing
    torch.testing.assert_close(
        loss, F.cross_entropy(logits.view(-1, 7), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum")
    )
    mean, _ = label_smoothed_nll(logits, target, eps, pad_id=0, reduction="mean")
    torch.testing.assert_close(mean, loss / 5)


def test_equation_3():
    d, w = 512, 4000
    assert learning_rate(1, d, w) == pytest.approx(d**-0.5 * 1 * w**-1.5)
    assert learning_rate(w, d, w) == pytest.approx(d**-0.5 * w**-0.5)  # the peak, at step = warmup
    assert learning_rate(4 * w, d, w) == pytest.approx(learning_rate(w, d, w) / 2)  # inverse square root decay
    assert learning_rate(w // 2, d, w) == pytest.approx(learning_rate(w, d, w) / 2)  # linear warmup
    assert learning_rate(100, d, w, scale=2.0) == pytest.approx(2 * learning_rate(100, d, w))
    peak = max(learning_rate(s, d, w) for s in range(1, 20000, 10))
    assert peak == pytest.approx(learning_rate(w, d, w), rel=1e-3)


def _reference_smoothed(logits, target, eps, pad_id=0):
    """The textbook form: log-softmax over V, then q-weighted sum (what loss.py avoids storing)."""
    lp = logits.float().log_softmax(-1)
    keep = target != pad_id
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = (1 - eps) * nll - eps * lp.mean(-1)
    return (loss * keep).sum(), (nll * keep).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_label_smoothing_gradient_matches_log_softmax(dtype):
    """Forward and gradient equal the log-softmax form, over several row blocks (300 x 5000
    logits is more than one block), through both outputs, with padding and 'mean'."""
    torch.manual_seed(0)
    base = (torch.randn(3, 100, 5000) * 3).to(dtype)
    target = torch.randint(1, 5000, (3, 100))
    target[0, 60:], target[2, 10:] = 0, 0
    x1, x2 = base.clone().requires_grad_(), base.clone().requires_grad_()
    loss, nll = label_smoothed_nll(x1, target, 0.1, pad_id=0, reduction="mean")
    (loss + 0.5 * nll).backward()
    ref_loss, ref_nll = _reference_smoothed(x2, target, 0.1)
    n = (target != 0).sum()
    ((ref_loss + 0.5 * ref_nll) / n).backward()
    torch.testing.assert_close(loss, ref_loss / n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll / n, rtol=1e-5, atol=1e-5)
    assert x1.grad.dtype == dtype
    torch.testing.assert_close(
        x1.grad.float(), x2.grad.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-7
    )
    assert x1.grad[0, 60:].abs().sum() == 0 and x1.grad[2, 10:].abs().sum() == 0  # padding


def test_fused_label_smoothing_gradcheck():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[1, 2, 0], [5, 0, 0]])
    assert torch.autograd.gradcheck(lambda z: label_smoothed_nll(z, target, 0.1, pad_id=0), (logits,))


def test_smoothing_mass_can_be_kept_off_classes_never_emitted():
    """exclude=(PAD, BOS): q = (1 - eps) onehot + eps / (V - 2) on the other classes, 0 on those two."""
    torch.manual_seed(0)
    V, eps = 9, 0.1
    logits, target = torch.randn(2, 4, V), torch.tensor([[4, 5, 3, 0], [1, 8, 0, 0]])
    loss, nll = label_smoothed_nll(logits, target, eps, pad_id=0, exclude=(0, 2))
    lp = logits.log_softmax(-1)
    expected = 0.0
    for b in range(2):
        for t in range(4):
            if target[b, t] == 0:
                continue
            q = torch.full((V,), eps / (V - 2))
            q[[0, 2]] = 0.0
            q[target[b, t]] += 1 - eps
            assert q.sum().item() == pytest.approx(1.0)
            expected += -(q * lp[b, t]).sum()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, label_smoothed_nll(logits, target, eps, pad_id=0)[1])  # nll is unchanged
    assert not torch.allclose(loss, label_smoothed_nll(logits, target, eps, pad_id=0)[0])
    x = torch.randn(2, 3, V, dtype=torch.float64, requires_grad=True)
    tgt = torch.tensor([[1, 2, 0], [5, 0, 0]])
    assert torch.autograd.gradcheck(lambda z: label_smoothed_nll(z, tgt, 0.1, pad_id=0, exclude=(0, 2)), (x,))
    with pytest.raises(ValueError, match="exclude"):
        label_smoothed_nll(logits, target, eps, exclude=(V,))


def test_trainer_smooths_over_emittable_classes_by_default():
    """TrainConfig.smooth_all_classes = False: the trainer's loss puts no mass on PAD and BOS."""
    from transduce.config import TrainConfig
    from transduce.model import Transformer
    from transduce.config import ModelConfig
    from transduce.train.step import evaluate
    from transduce.data.vocab import BOS, PAD

    assert TrainConfig().smooth_all_classes is False
    import inspect
    from transduce.train import step

    assert inspect.signature(step.train_step).parameters["smooth_exclude"].default is None  # the model's
    assert inspect.signature(evaluate).parameters["smooth_exclude"].default is None
    model = Transformer(ModelConfig(src_vocab_size=20, n_layers=1, d_model=8, d_ff=16, n_heads=2))
    assert step.loss_ids(model, None, None) == (PAD, (PAD, BOS))
    model = Transformer(
        ModelConfig(src_vocab_size=20, n_layers=1, d_model=8, d_ff=16, n_heads=2, pad_id=19, bos_id=19, eos_id=0)
    )  # Marian's layout: the decoder starts with PAD
    assert step.loss_ids(model, None, None) == (19, (19, 19))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_fused_loss_off_the_cpu_is_the_blocked_loss(dtype, monkeypatch):
    """The loss a GPU trains with (`_FusedSmoothedCrossEntropy`, through PyTorch's fused
    log-softmax) computes the CPU's blocked loss, nll and gradient: PAD rows left out, PAD and BOS
    given no smoothing mass, blocks of rows (a small block size forces several), a scaled loss and
    nll both used. Run here on the CPU by calling each directly."""
    from transduce.train import loss as loss_module

    torch.manual_seed(0)
    logits = (torch.randn(300, 3000) * 3).to(getattr(torch, dtype))
    target = torch.randint(3, 3000, (300,))
    target[280:] = 0

    def run(function):
        z = logits.detach().clone().requires_grad_()
        loss, nll = function.apply(z, target, 0.1, 0, (0, 2))
        (0.7 * loss + 0.3 * nll).backward()
        return loss, nll, z.grad

    want = run(loss_module._SmoothedCrossEntropy)
    monkeypatch.setattr(
        loss_module, "_row_blocks", lambda x, d: (range(0, x.size(0), 70), 70, torch.empty(70, x.size(1), dtype=d))
    )
    got = run(loss_module._FusedSmoothedCrossEntropy)
    tol = 1e-5 if dtype == "float32" else 1e-2
    for w, g in zip(want, got):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-5, atol=tol)
