"""A synthetic task that proves the pieces fit: copy or reverse random token sequences.

Masks, the right shift, the loss, the schedule and the decoding cache all have to be right for a
small Transformer to reach ~100% exact match on held-out sequences after a short CPU run. The
sequences are made in memory, so it trains with the trainer's pieces (`prepare_for_training`,
`build_optimizer`, `train_step`, `learning_rate`) rather than its `train`. Used by the tests and by
`transduce synthetic`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .config import Config, ModelConfig
from .data.vocab import BOS, EOS, PAD, SPECIAL_PIECES
from .decoding.search import greedy_decode
from .model import Transformer
from .decoding.ready import make_ready
from .train.schedule import learning_rate
from .train.step import build_optimizer, prepare_for_training, train_step

N_SPECIAL = len(SPECIAL_PIECES)  # symbols start after PAD, UNK, BOS, EOS


@dataclass
class SyntheticResult:
    task: str
    steps: int
    dev_exact_match: float
    seconds: float
    final_loss: float
    exact_match: float
    n_eval: int


def make_batch(task: str, batch_size: int, n_symbols: int, min_len: int, max_len: int, g: torch.Generator):
    """Random sequences of symbols (ids >= 4) with random lengths; returns (src, tgt_in, tgt_out)
    right-padded: src = x + EOS, tgt_in = BOS + y, tgt_out = y + EOS, y = x or reversed x."""
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=g)
    T = int(lengths.max()) + 1
    src = torch.full((batch_size, T), PAD, dtype=torch.long)
    tgt_in, tgt_out = src.clone(), src.clone()
    for i, n in enumerate(lengths.tolist()):
        x = torch.randint(N_SPECIAL, N_SPECIAL + n_symbols, (n,), generator=g)
        y = x.flip(0) if task == "reverse" else x
        src[i, :n], src[i, n] = x, EOS
        tgt_in[i, 0], tgt_in[i, 1 : n + 1] = BOS, y
        tgt_out[i, :n], tgt_out[i, n] = y, EOS
    return src, tgt_in, tgt_out


def train_synthetic(
    task: str = "reverse",
    *,
    seconds: float = float("inf"),
    max_steps: int = 3000,
    n_symbols: int = 10,
    min_len: int = 1,
    max_len: int = 10,
    batch_size: int = 128,
    warmup_steps: int = 100,
    lr_scale: float = 0.2,
    n_eval: int = 500,
    eval_every: int = 100,
    n_dev: int = 500,
    seed: int = 0,
    model_config: ModelConfig | None = None,
    progress: bool = False,
) -> tuple[Transformer, SyntheticResult]:
    """Train a small Transformer on the task, then report greedy exact match on `n_eval` held-out
    sequences. Stops when exact match on `n_dev` development sequences (every `eval_every` steps)
    reaches 100%, or after `max_steps`, or after `seconds`; the three sets are seeded apart."""
    if task not in ("copy", "reverse"):
        raise ValueError(f"task must be 'copy' or 'reverse', not {task!r}")
    torch.manual_seed(seed)
    c = model_config or ModelConfig(
        src_vocab_size=N_SPECIAL + n_symbols, n_layers=2, d_model=128, d_ff=256, n_heads=4, dropout=0.0
    )
    model = prepare_for_training(Transformer(c), torch.device("cpu"), "fp32")  # as the trainer does
    opt = build_optimizer(model, Config(model=c))  # Adam, beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (5.3)
    g_train = torch.Generator().manual_seed(seed)
    g_dev = torch.Generator().manual_seed(seed + 500_009)
    dev = make_batch(task, n_dev, n_symbols, min_len, max_len, g_dev)
    start, step, loss_value, dev_exact = time.perf_counter(), 0, float("nan"), 0.0
    bar = tqdm(total=max_steps, unit="step", desc=f"synthetic {task}", leave=False, disable=not progress)
    while step < max_steps and time.perf_counter() - start < seconds:
        src, tgt_in, tgt_out = make_batch(task, batch_size, n_symbols, min_len, max_len, g_train)
        batch = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "ntokens": int((tgt_out != PAD).sum())}
        lr = learning_rate(step + 1, c.d_model, warmup_steps, lr_scale)  # equation 3, step counted from 1
        sums = train_step(model, opt, [batch], lr=lr, label_smoothing=0.0, pad_id=PAD, smooth_exclude=()).sums
        step += 1
        if step % eval_every == 0:
            loss_value = sums[0].item() / batch["ntokens"]  # per target token
            dev_exact = exact_match(model, dev)
            model.train()
            bar.update(eval_every)
            bar.set_postfix(loss=f"{loss_value:.4f}", dev_exact=f"{dev_exact:.1%}")
            if dev_exact == 1.0:
                break
    bar.close()
    elapsed = time.perf_counter() - start

    g_eval = torch.Generator().manual_seed(seed + 1_000_003)
    exact = exact_match(model, make_batch(task, n_eval, n_symbols, min_len, max_len, g_eval))
    return model, SyntheticResult(task, step, dev_exact, elapsed, loss_value, exact, n_eval)


def exact_match(model: Transformer, batch) -> float:
    """Fraction of sequences that greedy decoding gets exactly right (`transduce.decoding.ready.make_ready`
    without packing: the weights change between calls)."""
    src, _, tgt_out = batch
    model.eval()
    undo = make_ready(model, pack=False)
    hyps = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5)
    undo()
    refs = [row[row != PAD][:-1].tolist() for row in tgt_out]
    return sum(h == r for h, r in zip(hyps, refs)) / len(refs)
