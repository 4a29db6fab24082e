import math

import pytest
import torch
import torch.nn.functional as F

from transduce.train.loss import label_smoothed_nll
from transduce.train.schedule import noam_lr, noam_scheduler


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
    assert noam_lr(1, d, w) == pytest.approx(d**-0.5 * 1 * w**-1.5)
    assert noam_lr(w, d, w) == pytest.approx(d**-0.5 * w**-0.5)  # the peak, at step = warmup
    assert noam_lr(4 * w, d, w) == pytest.approx(noam_lr(w, d, w) / 2)  # inverse square root decay
    assert noam_lr(w // 2, d, w) == pytest.approx(noam_lr(w, d, w) / 2)  # linear warmup
    assert noam_lr(100, d, w, scale=2.0) == pytest.approx(2 * noam_lr(100, d, w))
    peak = max(noam_lr(s, d, w) for s in range(1, 20000, 10))
    assert peak == pytest.approx(noam_lr(w, d, w), rel=1e-3)


def test_scheduler_applies_equation_3_per_step():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=123.0)
    sched = noam_scheduler(opt, 64, warmup_steps=10)
    for step in range(1, 30):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, 10))
        opt.step()
        sched.step()
