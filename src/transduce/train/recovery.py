"""What interrupts a training run, and what the trainer does about it (docs/cluster.md), in the
order of the trainer's phases: one trainer per run directory (`take_lock`), a fresh start or exact
resume from the newest intact checkpoint (`restore`), a step whose loss or gradient is not finite
(`skipped`), a checkpoint that cannot be written (`checkpoint`), SIGTERM or SIGINT (`interrupted`).
A run directory with checkpoints is continued by default, as long as it is asked for with the
run's own config (`config_differences`); `TrainOptions.restart` replaces its checkpoints instead,
once the new run has started (`replace_previous`). What a checkpoint holds and where it lies is
`transduce.checkpoint`'s.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from ..checkpoint import (
    CHECKPOINTS,
    CONFIG,
    DamagedCheckpoint,
    LoadedCheckpoint,
    RunLock,
    TrainingState,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_config,
    save_checkpoint,
    set_aside,
)
from ..config import Config
from ..errors import TrainingStopped, UsageError
from .distributed import DistEnv, agree, gather_rng_states, restore_rng_states, seed_dropout
from .state import LoopState, Run


def take_lock(lock: RunLock, env: DistEnv) -> None:
    """One trainer per run directory: rank 0 takes the lock; every rank stops if it cannot."""
    error = None
    if env.is_main:
        try:
            lock.acquire()
        except TrainingStopped as e:
            error = e
    if agree(env, [error is not None])[0]:
        raise error or TrainingStopped(f"{lock.path.parent} is being written by another trainer (see rank 0)")


@dataclass
class Start:
    """Where a run starts: step 0, or where its latest checkpoint left off (`restore`)."""

    step: int = 0
    epoch: int = 0
    position: int = 0  # the index of the next batch in the epoch's order
    train_seconds: float = 0.0  # training time of the earlier sessions
    target_tokens: int = 0
    saved_at: int = -1  # the step of the newest checkpoint (-1: none)


def restore(run: Run) -> Start:
    """Where to start, with dropout's RNG set for it: at step 0, or exactly where the run's latest
    checkpoint left off (weights, Adam's moments, the step, the position in the batch order, the
    GradScaler and every rank's RNG state)."""
    env, opts = run.env, run.opts
    latest = latest_checkpoint(run.run_dir) if opts.continues else None
    if latest is None and list_checkpoints(run.run_dir) and not opts.restart:
        raise UsageError(
            f"{run.run_dir} already has checkpoints: continue it (run the same command again), start over "
            "with --restart (its checkpoints replaced), or use another --run-dir"
        )
    if latest is None:
        seed_dropout(opts.seed, env.rank)
        if opts.init is not None:  # fine-tuning: MODEL's weights; Adam and equation 3 start afresh
            from ..finetune import load_init_weights

            weights, what = load_init_weights(opts.init, env.device)
            run.model.load_state_dict(weights)
            env.say(f"starting from the weights of {what}")
        return Start()
    check_same_config(run, latest)
    ckpt = load_newest_intact(run, latest)
    s = ckpt.state
    start = Start(
        step=s.step,
        epoch=s.epoch,
        position=s.position,
        train_seconds=s.train_seconds,
        target_tokens=s.target_tokens,
        saved_at=s.step,
    )
    same_batches = (s.world_size, s.max_tokens, s.seed) == (env.world_size, opts.max_tokens, opts.seed)
    if not same_batches:  # the saved position indexes another batch list: go on with a fresh epoch
        start.epoch, start.position = s.epoch + 1, 0
        env.say(
            f"note: batching changed since the checkpoint (world size, max tokens or seed): continuing at epoch {start.epoch}"
        )
    if run.scaler is not None and s.scaler:
        run.scaler.load_state_dict(s.scaler)
    if not (same_batches and restore_rng_states(ckpt.rng, env)):
        seed_dropout(opts.seed + s.step, env.rank)
    return start


RESUMABLE_CHANGES = ("train.max_steps", "train.checkpoint_minutes", "train.average_last", "train.max_tokens")
"""Config fields a resumed run may change: how long it runs, how often and how many checkpoints it
keeps, and the batch size (recorded from the batching options, whose change `restore` handles)."""


def config_differences(run_config: Config, config: Config) -> list[str]:
    """'FIELD VALUE (the run's VALUE)' for each field of `config` that differs from the run's,
    `RESUMABLE_CHANGES` aside."""
    ours, theirs = config.to_dict(), run_config.to_dict()
    return [
        f"{section}.{name} {value!r} (the run's {theirs[section].get(name)!r})"
        for section in ("model", "train")
        for name, value in ours[section].items()
        if f"{section}.{name}" not in RESUMABLE_CHANGES and value != theirs[section].get(name)
    ]


def run_config(run_dir: Path, latest: Path) -> Config:
    """The config of the run in `run_dir` (its config.json, else its latest checkpoint's)."""
    return load_config(run_dir if (run_dir / CONFIG).is_file() else latest)


def check_same_config(run: Run, latest: Path) -> None:
    """Refuse to continue the checkpoints of a run with another config (before anything is loaded
    or written), naming the fields that differ and how to start over."""
    differences = config_differences(run_config(run.run_dir, latest), run.config)
    if differences:
        raise UsageError(
            f"{run.run_dir} was trained with another config: {'; '.join(differences)}; to continue it, "
            "drop the flags that change these; to start over in it, add --restart (its checkpoints "
            "are replaced); or use another --run-dir"
        )


def replace_previous(run_dir: Path, env: DistEnv) -> None:
    """--restart, once the new run has started (rank 0): the earlier run's checkpoints and model/
    removed, each first renamed out of sight in one step, so that a run directory never holds half
    of them."""
    gone = [name for name in (CHECKPOINTS, "model") if (run_dir / name).exists()]
    for name in gone:
        aside = run_dir / f".replaced-{name}-{os.getpid()}"
        os.replace(run_dir / name, aside)
        shutil.rmtree(aside, ignore_errors=True)
    if gone:
        env.say(
            f"--restart: the earlier run's {' and '.join(n + '/' for n in gone)} in {run_dir} removed; starting at step 0"
        )


def load_newest_intact(run: Run, latest: Path) -> LoadedCheckpoint:
    """Load `latest`, or if it is damaged (a checksum differs, a file is missing or truncated)
    the newest intact checkpoint before it, saying which and how many steps that loses. Damaged
    checkpoints are set aside as step_N.damaged (rank 0, once every rank has loaded)."""
    env = run.env
    candidates = [latest] + [p for _, p in reversed(list_checkpoints(run.run_dir)) if p != latest]
    damaged: list[Path] = []
    for path in candidates:
        try:
            ckpt = load_checkpoint(path, run.model, run.optimizer, env.device)
        except DamagedCheckpoint as e:
            env.say(f"warning: {e}")
            damaged.append(path)
            continue
        if damaged:
            newest = max(checkpoint_step(p) for p in damaged)
            lost = newest - ckpt.state.step
            env.say(
                f"resuming from {path.name}, the newest intact checkpoint: {lost} step{'s' * (lost != 1)} "
                f"lost; set aside as *.damaged: {', '.join(p.name for p in damaged)}"
            )
            agree(env, [True])  # a barrier: every rank has read its checkpoint before the renames
            if env.is_main:
                for p in damaged:
                    set_aside(p)
        else:
            env.say(f"resuming {run.run_dir} from {path.name}, its newest checkpoint (step {ckpt.state.step})")
        return ckpt
    raise TrainingStopped(
        f"{run.run_dir / 'checkpoints'}: every checkpoint is damaged "
        f"({', '.join(p.name for p in damaged)}); nothing to resume from"
    )


def skipped(run: Run, state: LoopState, sums: Tensor, norm: Tensor, where: list, indices: list) -> None:
    """A step not taken (`state.skipped_in_a_row` counted by the trainer): logged with its batches
    (epoch, index in the epoch, first pair indices); `max_nonfinite` in a row stop the run with a
    checkpoint of the weights from before them."""
    env = run.env
    overflow = run.scaler is not None
    loss, grad_norm = float(sums[0]), float(norm)
    batches = ", ".join(f"epoch {e} #{i}" for e, i in where)
    if run.log is not None:
        run.log.write(
            "skipped",
            state.step + 1,
            reason="fp16 overflow" if overflow else "non-finite",
            loss=loss,
            grad_norm=grad_norm,
            in_a_row=state.skipped_in_a_row,
            batches=[{"epoch": e, "index": i, "pairs": [int(x) for x in ix[:8]]} for (e, i), ix in zip(where, indices)],
            **({"loss_scale": float(run.scaler.get_scale())} if overflow else {}),
        )
    if overflow:
        env.say(
            f"step {state.step + 1}: fp16 overflow, skipped by the loss scaler (scale now "
            f"{run.scaler.get_scale():g}); batches {batches}",
            run.bar,
        )
        return
    env.say(
        f"step {state.step + 1}: non-finite loss ({loss:g}) or gradient norm ({grad_norm:g}) on batches {batches}: "
        f"skipped, no update ({state.skipped_in_a_row} in a row)",
        run.bar,
    )
    if state.skipped_in_a_row >= run.opts.max_nonfinite:
        checkpoint(run, state, on_interval=False)
        raise TrainingStopped(
            f"{state.skipped_in_a_row} steps in a row had a non-finite loss or gradient (the last on batches {batches}); "
            f"the weights from before them, after step {state.step}, are in "
            f"{run.run_dir / 'checkpoints'} (the batch order continues after them): lower the rate (--lr-scale), "
            "check the data, then run the same command again: it resumes"
        )


def checkpoint(run: Run, state: LoopState, on_interval: bool = True) -> None:
    """A training checkpoint of the state after `state.step` (every rank calls it: the RNG
    states are gathered; rank 0 writes)."""
    rng = gather_rng_states(run.env)  # a collective: every rank
    error = write_checkpoint(run, state, rng, on_interval) if run.env.is_main else None
    if agree(run.env, [error is not None])[0]:
        previous = latest_checkpoint(run.run_dir)
        raise TrainingStopped(
            f"the checkpoint of step {state.step} could not be written ({error or 'on rank 0'}); "
            + (
                f"{previous.name} and `latest` are intact: free space, then run the same command again: it resumes "
                f"(from step {checkpoint_step(previous)}: {state.step - checkpoint_step(previous)} steps lost)"
                if previous is not None
                else "no earlier checkpoint: the run starts again"
            )
        )


def write_checkpoint(run: Run, state: LoopState, rng: dict, on_interval: bool) -> str | None:
    """Rank 0 writes the checkpoint; a failed write (a full disk) is returned as its message, the
    previous checkpoints and `latest` left as they were (`save_checkpoint` writes beside them)."""
    config, opts, t = run.config, run.opts, run.config.train
    training = TrainingState(
        step=state.step,
        epoch=state.stream.epoch,
        position=state.stream.position,
        world_size=run.env.world_size,
        max_tokens=opts.max_tokens,
        update_freq=opts.update_freq,
        seed=opts.seed,
        lr=state.lr,
        train_seconds=state.train_seconds + (time.perf_counter() - state.start),
        target_tokens=state.tokens_seen,
        scaler=run.scaler.state_dict() if run.scaler is not None else None,
        schedule={
            "kind": "noam",
            "d_model": config.model.d_model,
            "warmup_steps": t.warmup_steps,
            "scale": t.lr_scale,
            "cooldown": opts.cooldown,
        },
        optimizer={k: v for k, v in run.optimizer.param_groups[0].items() if k != "params"},
        on_interval=on_interval,
        precision=run.precision,
    )
    try:
        path = save_checkpoint(run.run_dir, run.model, config, run.optimizer, training, rng, opts.keep_last)
    except OSError as e:
        message = f"{e.filename}: {e.strerror}" if e.filename and e.strerror else (e.strerror or str(e))
        run.log.write("checkpoint_failed", state.step, error=message)
        return message
    run.log.write("checkpoint", state.step, path=str(path))
    return None


def interrupted(run: Run, state: LoopState) -> None:
    """Stopped by SIGTERM or SIGINT: a checkpoint at this step (unless there is one), no final
    validation and no model directory (the run is not finished)."""
    env, step = run.env, state.step
    if state.saved_at != step:
        every = run.opts.save_every_steps
        checkpoint(run, state, on_interval=bool(every) and step % every == 0)
    if env.is_main:
        run.log.write("interrupted", step, signal=state.interrupted)
        run.log.close()
    if run.bar is not None:
        run.bar.close()
    env.say(
        f"interrupted at step {step} by {state.interrupted}; the checkpoint is in {run.run_dir / 'checkpoints'}: "
        "run the same command again to continue"
    )
