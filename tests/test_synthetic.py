"""The first end-to-end check (issue: foundation): a small Transformer learns to reverse random
token sequences in about a minute of CPU training and greedy decoding gets >= 99% of held-out
sequences exactly right. Masks, the right shift, the loss, equation 3 and the decoding cache all
have to be right for that."""

import torch

from transduce.synthetic import make_batch, train_synthetic


def test_make_batch_shifts_targets():
    g = torch.Generator().manual_seed(0)
    src, tgt_in, tgt_out = make_batch("reverse", 4, 10, 2, 5, g)
    for s, ti, to in zip(src, tgt_in, tgt_out):
        n = int((s != 0).sum()) - 1
        assert s[n] == 3 and ti[0] == 2 and to[n] == 3  # EOS ends source and output; BOS starts input
        assert torch.equal(to[:n], s[:n].flip(0)) and torch.equal(ti[1 : n + 1], to[:n])


def test_reverse_task_reaches_99_percent_exact_match():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is as fast and does not fight other jobs
    try:
        _, r = train_synthetic("reverse", seed=0)
    finally:
        torch.set_num_threads(threads)
    assert r.exact_match >= 0.99, r  # 500 held-out sequences, never seen in training or dev


def test_the_command_fails_the_check_and_says_why_when_its_step_cap_stops_it(capsys):
    from transduce.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["synthetic", "--max-steps", "20"]) == 1  # far too few steps to learn anything
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert "task=reverse steps=20" in captured.out
    assert "check FAILED: held-out exact match" in captured.err and "stopped at --max-steps 20" in captured.err
