"""`transduce train`: the training loop of Section 5 (docs/training.md), in one place.

What the paper says, and where it is done:

* 5.1 batches of about 25000 source and 25000 target tokens: one optimizer step is `update_freq`
  micro-batches of at most `max_tokens` padded tokens on each of `world_size` processes (8 GPUs x
  3125, or one process with --update-freq 8), drawn by `BatchStream` epoch after epoch.
* 5.2 8 GPUs, 100K steps (base) / 300K (big): torchrun + DistributedDataParallel
  (`transduce.train.distributed.setup_distributed`); --max-steps and --max-minutes bound the run.
* 5.3 Adam (`transduce.train.step.build_optimizer`) at the rate of equation 3, set before every
  optimizer step (`transduce.train.schedule.learning_rate`; not in the paper, an option: --cooldown).
* 5.4 dropout (on the CPU `transduce.fast.train.BitDropout`) and label smoothing eps_ls = 0.1
  (`transduce.train.loss.label_smoothed_nll`).
* 6.1 checkpoints every 10 minutes (train.checkpoint_minutes) or N steps, the last K kept for
  averaging (`transduce average`); what is written where: `transduce.checkpoint`.

`train` reads top to bottom: set up, restore (a fresh start, or exact resume: weights, Adam's
moments, the step, the position in the batch order and every rank's RNG state, so that a resumed
run ends as if never stopped), the steps (one `transduce.train.step.train_step` each, which also
documents the loss normalisation; then the decisions to stop, logging, validation, checkpoints),
finish. Only rank 0 writes. What the phases share is in `transduce.train.state`; the set-up and
the opening before the first step (and the run's config from the data, `config_for_data`), in
`transduce.train.setup`; what interrupts a run and what the trainer does about it, in
`transduce.train.recovery` (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checkpoint import RunLock, save_model
from ..config import Config
from ..model import Transformer
from . import recovery
from .distributed import agree, all_reduce_, any_rank, setup_distributed
from .schedule import learning_rate
from .setup import open_run, set_up
from .signals import StopSignals
from .state import LoopState, Run, TrainOptions
from .step import evaluate, to_device, train_step


@dataclass
class TrainResult:
    """What `train` returns."""

    model: Transformer  # the plain module, on its device
    step: int
    valid: dict | None  # the last validation: loss, nll, ppl per target token
    run_dir: Path
    target_tokens_per_s: float
    interrupted: str | None = None  # the signal that stopped the run (after its checkpoint), e.g. "SIGTERM"


# --- the loop: set up, restore, the steps, finish -------------------------------------------------


def train(
    config: Config,
    data_dir: str | os.PathLike,
    run_dir: str | os.PathLike,
    opts: TrainOptions | None = None,
    *,
    log_extra: dict | None = None,
) -> TrainResult:
    """Train `config` on the prepared data in `data_dir`, writing into `run_dir`. Launched by
    torchrun, joins the process group itself. A checkpoint in `run_dir` is continued exactly (the
    config must then be the run's own), or with `opts.restart` replaced by this run once it has started."""
    given = opts or TrainOptions()
    env = setup_distributed(given.device)
    lock = RunLock(run_dir)
    created = not Path(run_dir).exists()  # by this call: removed again if it fails before writing into it
    try:
        recovery.take_lock(lock, env)
        with StopSignals() as signals:
            # Set up; restore: step 0, or exactly where the latest intact checkpoint left off.
            run = set_up(config, Path(data_dir), Path(run_dir), given, env, signals)
            start = recovery.restore(run)
            run, state = open_run(run, start, given, log_extra or {})
            opts, t = run.opts, config.train
            # The steps: one optimizer step each (`train_step`), then the decisions, the log, validation, checkpoints.
            while not state.stop:
                drawn = state.stream.take(opts.update_freq)  # update_freq micro-batches on every rank (5.1)
                batches = [to_device(run.train_set.collate(indices), env.device) for indices, _ in drawn]
                state.lr = learning_rate(
                    state.step + 1,
                    config.model.d_model,
                    t.warmup_steps,
                    t.lr_scale,  # equation 3
                    cooldown=opts.cooldown,
                    max_steps=t.max_steps,
                )
                sums, norm, updated = train_step(
                    run.train_model,
                    run.optimizer,
                    batches,
                    lr=state.lr,
                    label_smoothing=t.label_smoothing,
                    env=env,
                    precision=run.precision,
                    scaler=run.scaler,
                    clip_norm=opts.clip_norm,
                    smooth_exclude=run.smooth_exclude,
                )
                if not updated:  # not taken: logged; max_nonfinite in a row stop the run
                    state.skipped_in_a_row += 0 if run.scaler is not None else 1  # an fp16 overflow is not counted
                    recovery.skipped(run, state, sums, norm, [w for _, w in drawn], [i for i, _ in drawn])
                    _decide(run, state, False)
                    continue
                state.step, state.skipped_in_a_row, state.grad_norm = state.step + 1, 0, norm
                state.interval_sums += sums
                state.interval_tokens += sum(b["ntokens"] for b in batches)
                if run.bar is not None:
                    run.bar.update(1)
                log_now = state.step % opts.log_every == 0 or state.step == t.max_steps
                now, save_due = _decide(run, state, log_now)
                if log_now or state.stop:
                    _log_interval(run, state, now)
                pause = time.perf_counter()  # validation and checkpoints do not count as training time
                if opts.valid_every and state.step % opts.valid_every == 0 and not state.stop:
                    state.valid, state.validated_at = _validate(run, state), state.step
                if not state.stop and ((opts.save_every_steps and state.step % opts.save_every_steps == 0) or save_due):
                    recovery.checkpoint(run, state)
                    state.saved_at, state.last_save = state.step, time.perf_counter()
                state.last_log += time.perf_counter() - pause
            # Finish: the final validation, checkpoint and model directory.
            return _finish(run, state)
    finally:
        held = lock.held
        lock.release()
        if created and held:  # never a directory another trainer holds; nothing but the lock in it: removed
            with contextlib.suppress(OSError):  # another process wrote into it meanwhile: leave it
                if [p.name for p in Path(run_dir).iterdir()] == [lock.path.name]:
                    lock.path.unlink()
                    Path(run_dir).rmdir()
        env.close()


def _decide(run: Run, state: LoopState, log_now: bool) -> tuple[float, bool]:
    """Whether to stop (state.stop; state.capped_at if --max-minutes binds first). Returns (now,
    whether a timed checkpoint is due). Rank 0's clock decides, with several processes at log
    intervals only (no host sync per step)."""
    opts, t = run.opts, run.config.train
    now = time.perf_counter()
    time_up = opts.max_minutes is not None and now - state.start >= 60 * opts.max_minutes
    save_due = t.checkpoint_minutes > 0 and now - state.last_save >= 60 * t.checkpoint_minutes
    if run.env.distributed:
        time_up, save_due = agree(run.env, [time_up, save_due]) if log_now else (False, False)
    # every rank stops at the same step, whichever got the signal
    signalled = any_rank(run.env, run.signals is not None and run.signals.requested is not None)
    if signalled and state.interrupted is None:
        state.interrupted = (
            run.signals.requested if run.signals and run.signals.requested else "a signal to another rank"
        )
    state.stop = state.step >= t.max_steps or time_up or signalled
    if time_up and state.step < t.max_steps:
        state.capped_at = state.step
    return now, save_due


def _log_interval(run: Run, state: LoopState, now: float) -> None:
    """The interval's loss and throughput over all ranks (one all-reduce: the one host sync per
    log interval); rank 0 writes the "train" record and a line (or the progress bar's postfix)."""
    env, opts, t = run.env, run.opts, run.config.train
    stats = torch.cat(
        [
            state.interval_sums.double(),
            torch.tensor([float(state.interval_tokens)], dtype=torch.float64, device=env.device),
        ]
    )
    loss_sum, nll_sum, ntok = all_reduce_(stats, env).tolist()
    tokens_per_s = ntok / max(now - state.last_log, 1e-9)
    state.tokens_seen += int(ntok)
    state.session_tokens += int(ntok)
    state.step_seconds += now - state.last_log
    if env.is_main:
        record = dict(
            epoch=state.stream.epoch,
            loss=loss_sum / ntok,
            nll=nll_sum / ntok,
            ppl=math.exp(min(nll_sum / ntok, 700.0)),
            lr=state.lr,
            target_tokens_per_s=tokens_per_s,
            target_tokens=int(ntok),
            elapsed_s=round(now - state.start, 2),
        )
        if state.grad_norm is not None:
            record["grad_norm"] = float(state.grad_norm)
        if run.scaler is not None:
            record["loss_scale"] = float(run.scaler.get_scale())
        run.log.write("train", state.step, **record)
        if run.bar is not None:
            run.bar.set_postfix(
                dict(loss=f"{record['loss']:.3f}", lr=f"{state.lr:.2e}", tok_s=f"{tokens_per_s:,.0f}"), refresh=False
            )
        else:
            eta = _remaining(
                state.step,
                t.max_steps,
                now - state.start,
                session_steps=state.step - state.first_step,
                minutes_left=opts.max_minutes and opts.max_minutes - (now - state.start) / 60,
            )
            env.say(
                f"step {state.step}/{t.max_steps} | epoch {state.stream.epoch} | loss {record['loss']:.4f} | "
                f"ppl {record['ppl']:.2f} | lr {state.lr:.3e} | {tokens_per_s:,.0f} target tokens/s | {eta}"
            )
    state.interval_sums.zero_()
    state.interval_tokens, state.grad_norm, state.last_log = 0, None, time.perf_counter()


def _validate(run: Run, state: LoopState) -> dict | None:
    """The loss on the validation split (None without one), logged and said."""
    if run.valid_set is None:
        return None
    r = evaluate(
        run.model,
        run.valid_set,
        max_tokens=run.opts.max_tokens,
        label_smoothing=run.config.train.label_smoothing,
        env=run.env,
        precision=run.precision,
        smooth_exclude=run.smooth_exclude,
    )
    if run.log is not None:
        run.log.write("valid", state.step, **r)
    run.env.say(
        f"step {state.step}: valid loss {r['loss']:.4f}, nll {r['nll']:.4f}, ppl {r['ppl']:.2f} ({r['tokens']} tokens)",
        run.bar,
    )
    return r


def _finish(run: Run, state: LoopState) -> TrainResult:
    """The final validation, checkpoint and model directory (an interrupted run: its checkpoint)."""
    env, opts, t, step = run.env, run.opts, run.config.train, state.step
    if state.capped_at is not None:
        env.say(
            f"note: --max-minutes {opts.max_minutes:g} stopped training at step {step} of {t.max_steps}: "
            "this model is not the recipe's (run the same command again to finish it)"
        )
        if run.log is not None:
            run.log.write("capped", step, max_steps=t.max_steps, max_minutes=opts.max_minutes)
    if state.interrupted is not None:
        recovery.interrupted(run, state)
        return TrainResult(
            run.model, step, state.valid, run.run_dir, _tokens_per_s(state), interrupted=state.interrupted
        )
    if state.validated_at != step:
        state.valid = _validate(run, state)
    if state.saved_at != step:
        # Forced off the interval (6.1's "last 5 at 10-minute intervals"): averaging leaves it out.
        recovery.checkpoint(run, state, on_interval=bool(opts.save_every_steps) and step % opts.save_every_steps == 0)
    tokens_per_s = _tokens_per_s(state)
    if env.is_main:
        save_model(run.model, run.config, run.run_dir / "model")
        run.log.write(
            "end",
            step,
            valid=state.valid,
            target_tokens_per_s=tokens_per_s,
            step_seconds=round(state.step_seconds, 2),
            wall_seconds=round(time.perf_counter() - state.start, 2),
        )
        run.log.close()
    if run.bar is not None:
        run.bar.close()
    session = (
        ""
        if state.first_step == 0
        else (
            f" in this session (from step {state.first_step}; the run's training time over all sessions, validation "
            f"and checkpoints included: {(state.train_seconds + time.perf_counter() - state.start) / 60:.1f} min)"
        )
    )
    env.say(
        f"done at step {step}: {tokens_per_s:,.0f} target tokens/s over {state.step_seconds:.1f} s of training "
        f"steps{session}; final model in {run.run_dir / 'model'}"
    )
    return TrainResult(run.model, step, state.valid, run.run_dir, tokens_per_s)


def _tokens_per_s(state: LoopState) -> float:
    """This session's target tokens per second of training steps."""
    return state.session_tokens / state.step_seconds if state.step_seconds > 0 else 0.0


def _remaining(step: int, max_steps: int, step_seconds: float, session_steps: int, minutes_left: float | None) -> str:
    """'ETA 12:34' for the steps left at this session's pace (`step_seconds` of wall-clock time,
    validation and checkpoints included, for `session_steps` steps), or the --max-minutes cap if
    that comes sooner."""
    if session_steps <= 0 or step_seconds <= 0:
        return "ETA --:--"
    seconds = (max_steps - step) * step_seconds / session_steps
    capped = minutes_left is not None and minutes_left * 60 < seconds
    seconds = max(minutes_left * 60, 0.0) if capped else seconds
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    text = f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"
    return f"ETA {text}" + (" (--max-minutes)" if capped else "")
