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
finish. Only rank 0 writes. What the phases share is in `transduce.train.state`; what interrupts
a run and what the trainer does about it, in `transduce.train.recovery` (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoint import RunLock, check_vocabulary, latest_checkpoint, prepare_run_dir, recorded_precision, save_model
from ..config import PRESETS, Config, apply_overrides, get_preset
from ..data.batching import ParallelDataset, data_special_ids, load_vocabs, read_metadata
from ..errors import UsageError
from ..fast.train import keep_freed_memory
from ..model import Transformer, count_parameters
from . import recovery
from .distributed import DistEnv, agree, all_reduce_, any_rank, set_threads, setup_distributed
from .schedule import learning_rate
from .signals import StopSignals
from .state import BatchStream, LoopState, Run, RunLog, TrainOptions
from .step import build_optimizer, evaluate, make_grad_scaler, prepare_for_training, resolve_precision, to_device, train_step


# --- run directory and configuration --------------------------------------------------------------


def config_for_data(preset: str, overrides: list[str], meta: dict) -> Config:
    """The preset, with the vocabulary sizes and special ids of the prepared data (a shared vocabulary
    -> share_embeddings as in 3.4; separate ones -> share_embeddings=False), then `--set` overrides."""
    try:
        config = get_preset(preset)
    except KeyError:
        raise UsageError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}") from None
    vocab = meta["vocab"]
    src_size, tgt_size = int(vocab["size"]["src"]), int(vocab["size"]["tgt"])
    shared = bool(vocab.get("shared", vocab["files"]["src"] == vocab["files"]["tgt"]))
    config.model = dataclasses.replace(
        config.model, src_vocab_size=src_size, tgt_vocab_size=None if shared else tgt_size,
        share_embeddings=config.model.share_embeddings and shared,
        **{f"{name}_id": i for name, i in data_special_ids(meta).to_dict().items()},
    )
    try:
        config = apply_overrides(config, overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    except TypeError as e:  # a value of the wrong type, e.g. model.n_heads=many
        raise UsageError(f"bad --set value ({e}) in: {' '.join(overrides)}") from None
    if (config.model.src_vocab_size, config.model.target_vocab_size) != (src_size, tgt_size):
        raise UsageError(f"the vocabulary sizes come from the data ({src_size}, {tgt_size}); do not override them")
    return config


def word_symbols(data_dir: Path, meta: dict) -> tuple[Tensor, Tensor]:
    """For `ModelConfig.word_positions` (not in the paper): the source pieces that begin a word,
    and the target symbols that are words: a tree's leaves for parsing data (`prepare` of a
    treebank), else the pieces that begin a word."""
    src_vocab, tgt_vocab = load_vocabs(data_dir)
    if meta.get("task") == "parsing":
        from ..parsing.constrain import leaf_symbols
        from ..parsing.parse import predicts_tags

        return src_vocab.word_starts(), leaf_symbols(tgt_vocab, predicts_tags(meta))
    return src_vocab.word_starts(), tgt_vocab.word_starts()


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
            run = _set_up(config, Path(data_dir), Path(run_dir), given, env, signals)
            start = recovery.restore(run)
            run, state = _open(run, start, given, log_extra or {})
            opts, t = run.opts, config.train
            # The steps: one optimizer step each (`train_step`), then the decisions, the log, validation, checkpoints.
            while not state.stop:
                drawn = state.stream.take(opts.update_freq)  # update_freq micro-batches on every rank (5.1)
                batches = [to_device(run.train_set.collate(indices), env.device) for indices, _ in drawn]
                state.lr = learning_rate(state.step + 1, config.model.d_model, t.warmup_steps, t.lr_scale,  # equation 3
                                         cooldown=opts.cooldown, max_steps=t.max_steps)
                sums, norm, updated = train_step(
                    run.train_model, run.optimizer, batches, lr=state.lr, label_smoothing=t.label_smoothing, env=env,
                    precision=run.precision, scaler=run.scaler, clip_norm=opts.clip_norm, smooth_exclude=run.smooth_exclude,
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


def _set_up(config: Config, data_dir: Path, run_dir: Path, given: TrainOptions, env: DistEnv,
            signals: StopSignals) -> Run:
    """Device threads, precision, the data, the model made ready to train, Adam, the GradScaler."""
    set_threads(env, given.threads)
    precision = resolve_precision(env, given.precision, config.model,
                                  recorded=recorded_precision(run_dir) if given.continues else None)
    opts = given.resolve(config, env.world_size)

    # Data (5.1).
    meta = read_metadata(data_dir)
    if opts.continues and latest_checkpoint(run_dir) is not None:
        check_vocabulary(run_dir, config, data_dir, meta)
    train_set = ParallelDataset.load(data_dir, "train")
    valid_set = ParallelDataset.load(data_dir, "valid") if (data_dir / "valid.src.idx").is_file() else None
    if train_set.ids != config.model.special_ids:
        raise UsageError(f"{data_dir}: its special ids {train_set.ids.to_dict()} are not the model's "
                         f"{config.model.special_ids.to_dict()}: prepare the data with the model's vocabulary")

    # Model, optimizer (5.3), precision.
    torch.manual_seed(opts.seed)
    model = Transformer(config.model)
    if model.word_positions is not None:  # not in the paper: which symbols are words, from the vocabularies
        model.word_positions.set_symbols(*word_symbols(data_dir, meta))
    model = prepare_for_training(model, env.device, precision)
    if env.device.type == "cpu":
        keep_freed_memory()  # no page faults on the large tensors every step allocates afresh
    ids = config.model.special_ids
    return Run(
        config=config, opts=opts, env=env, data_dir=data_dir, run_dir=run_dir, precision=precision,
        smooth_exclude=() if config.train.smooth_all_classes else (ids.pad, ids.bos),  # 5.4: what is never emitted
        meta=meta, train_set=train_set, valid_set=valid_set, model=model, optimizer=build_optimizer(model, config),
        scaler=make_grad_scaler(env.device, precision), signals=signals,
    )


def _open(run: Run, start: recovery.Start, given: TrainOptions, log_extra: dict) -> tuple[Run, LoopState]:
    """Start the batch stream at `start`, write the run directory (rank 0), make the module that
    trains (optionally compiled, in DDP for several processes), open the log, say what will be
    done, open the progress bar; the loop's clocks start."""
    env, opts, config = run.env, run.opts, run.config
    t = config.train
    if start.step > t.max_steps:  # before anything is written: the run is not rewound, nor its model rewritten
        raise UsageError(f"{run.run_dir} is already at step {start.step}, past --max-steps {t.max_steps}: nothing "
                         "was trained (a larger --max-steps continues it)")
    stream = BatchStream(run.train_set, opts.max_tokens, seed=opts.seed, num_shards=env.world_size, shard_id=env.rank,
                         epoch=start.epoch, position=start.position)  # first: it refuses an empty split
    if env.is_main:
        if opts.restart:  # the new run has started: the earlier run's checkpoints go now, not before
            recovery.replace_previous(run.run_dir, env)
        prepare_run_dir(run.run_dir, run.data_dir, run.meta, config)
    run.model.train()
    train_model: nn.Module = torch.compile(run.model) if opts.compile else run.model
    if env.distributed:
        train_model = nn.parallel.DistributedDataParallel(
            train_model, device_ids=[env.device.index] if env.device.type == "cuda" else None, gradient_as_bucket_view=True)
    run = dataclasses.replace(run, train_model=train_model,
                              log=RunLog(run.run_dir / "logs", opts.tensorboard) if env.is_main else None)
    _announce(run, stream, start.step, given, log_extra)  # before the bar: on a terminal, not on the bar's line
    if env.is_main and opts.progress and sys.stderr.isatty():
        from tqdm import tqdm

        run = dataclasses.replace(run, bar=tqdm(total=t.max_steps, initial=start.step, unit="step", dynamic_ncols=True,
                                                desc="train"))
    now = time.perf_counter()
    return run, LoopState(
        step=start.step, stream=stream, lr=learning_rate(start.step, config.model.d_model, t.warmup_steps, t.lr_scale,
                                                         cooldown=opts.cooldown, max_steps=t.max_steps),
        stop=start.step >= t.max_steps, train_seconds=start.train_seconds, tokens_seen=start.target_tokens,
        saved_at=start.saved_at, first_step=start.step, start=now, last_save=now, last_log=now,
        interval_sums=torch.zeros(2, device=env.device),
    )


def _announce(run: Run, stream: BatchStream, step: int, given: TrainOptions, log_extra: dict) -> None:
    """The log's "start" record and the opening lines."""
    env, opts, config = run.env, run.opts, run.config
    n_params = count_parameters(run.model)
    if not config.model.share_embeddings:  # 3.4's three-way tying needs one vocabulary: say what is shared
        env.say("note: separate source and target vocabularies (or model.share_embeddings=false): the source "
                "embedding is its own matrix; the target embedding and the pre-softmax projection are "
                + ("tied (model.tie_output)" if config.model.tie_output else "separate too (model.tie_output=false)"))
    if run.log is not None:
        run.log.write("start", step, parameters=n_params, world_size=env.world_size, device=str(env.device),
                      precision=run.precision, max_tokens_per_batch=opts.max_tokens, update_freq=opts.update_freq,
                      batches_per_epoch=len(stream) * env.world_size, threads=torch.get_num_threads(),
                      restart=env.restart, config=config.to_dict(), options=dataclasses.asdict(given), **log_extra)
    if env.restart:  # torchrun --max-restarts: the workers were started again after a failure
        env.say(f"torchrun restart {env.restart}: " + (f"resuming at step {step}" if step else "starting afresh (no checkpoint)"))
    env.say(f"training {n_params / 1e6:.1f}M parameters on {env.world_size} x {env.device} ({run.precision}), "
            f"step {step} -> {config.train.max_steps}, {opts.max_tokens} tokens x {opts.update_freq} micro-batches x "
            f"{env.world_size} processes per step; {len(stream) * env.world_size} batches per epoch")


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
        state.interrupted = (run.signals.requested if run.signals and run.signals.requested else "a signal to another rank")
    state.stop = state.step >= t.max_steps or time_up or signalled
    if time_up and state.step < t.max_steps:
        state.capped_at = state.step
    return now, save_due


def _log_interval(run: Run, state: LoopState, now: float) -> None:
    """The interval's loss and throughput over all ranks (one all-reduce: the one host sync per
    log interval); rank 0 writes the "train" record and a line (or the progress bar's postfix)."""
    env, opts, t = run.env, run.opts, run.config.train
    stats = torch.cat([state.interval_sums.double(),
                       torch.tensor([float(state.interval_tokens)], dtype=torch.float64, device=env.device)])
    loss_sum, nll_sum, ntok = all_reduce_(stats, env).tolist()
    tokens_per_s = ntok / max(now - state.last_log, 1e-9)
    state.tokens_seen += int(ntok)
    state.session_tokens += int(ntok)
    state.step_seconds += now - state.last_log
    if env.is_main:
        record = dict(
            epoch=state.stream.epoch, loss=loss_sum / ntok, nll=nll_sum / ntok, ppl=math.exp(min(nll_sum / ntok, 700.0)),
            lr=state.lr, target_tokens_per_s=tokens_per_s, target_tokens=int(ntok),
            elapsed_s=round(now - state.start, 2),
        )
        if state.grad_norm is not None:
            record["grad_norm"] = float(state.grad_norm)
        if run.scaler is not None:
            record["loss_scale"] = float(run.scaler.get_scale())
        run.log.write("train", state.step, **record)
        if run.bar is not None:
            run.bar.set_postfix(dict(loss=f"{record['loss']:.3f}", lr=f"{state.lr:.2e}", tok_s=f"{tokens_per_s:,.0f}"),
                                refresh=False)
        else:
            eta = _remaining(state.step, t.max_steps, now - state.start, session_steps=state.step - state.first_step,
                             minutes_left=opts.max_minutes and opts.max_minutes - (now - state.start) / 60)
            env.say(f"step {state.step}/{t.max_steps} | epoch {state.stream.epoch} | loss {record['loss']:.4f} | "
                    f"ppl {record['ppl']:.2f} | lr {state.lr:.3e} | {tokens_per_s:,.0f} target tokens/s | {eta}")
    state.interval_sums.zero_()
    state.interval_tokens, state.grad_norm, state.last_log = 0, None, time.perf_counter()


def _validate(run: Run, state: LoopState) -> dict | None:
    """The loss on the validation split (None without one), logged and said."""
    if run.valid_set is None:
        return None
    r = evaluate(run.model, run.valid_set, max_tokens=run.opts.max_tokens, label_smoothing=run.config.train.label_smoothing,
                 env=run.env, precision=run.precision, smooth_exclude=run.smooth_exclude)
    if run.log is not None:
        run.log.write("valid", state.step, **r)
    run.env.say(f"step {state.step}: valid loss {r['loss']:.4f}, nll {r['nll']:.4f}, ppl {r['ppl']:.2f} "
                f"({r['tokens']} tokens)", run.bar)
    return r


def _finish(run: Run, state: LoopState) -> TrainResult:
    """The final validation, checkpoint and model directory (an interrupted run: its checkpoint)."""
    env, opts, t, step = run.env, run.opts, run.config.train, state.step
    if state.capped_at is not None:
        env.say(f"note: --max-minutes {opts.max_minutes:g} stopped training at step {step} of {t.max_steps}: "
                "this model is not the recipe's (run the same command again to finish it)")
        if run.log is not None:
            run.log.write("capped", step, max_steps=t.max_steps, max_minutes=opts.max_minutes)
    if state.interrupted is not None:
        recovery.interrupted(run, state)
        return TrainResult(run.model, step, state.valid, run.run_dir, _tokens_per_s(state), interrupted=state.interrupted)
    if state.validated_at != step:
        state.valid = _validate(run, state)
    if state.saved_at != step:
        # Forced off the interval (6.1's "last 5 at 10-minute intervals"): averaging leaves it out.
        recovery.checkpoint(run, state, on_interval=bool(opts.save_every_steps) and step % opts.save_every_steps == 0)
    tokens_per_s = _tokens_per_s(state)
    if env.is_main:
        save_model(run.model, run.config, run.run_dir / "model")
        run.log.write("end", step, valid=state.valid, target_tokens_per_s=tokens_per_s,
                      step_seconds=round(state.step_seconds, 2), wall_seconds=round(time.perf_counter() - state.start, 2))
        run.log.close()
    if run.bar is not None:
        run.bar.close()
    session = "" if state.first_step == 0 else (
        f" in this session (from step {state.first_step}; the run's training time over all sessions, validation "
        f"and checkpoints included: {(state.train_seconds + time.perf_counter() - state.start) / 60:.1f} min)")
    env.say(f"done at step {step}: {tokens_per_s:,.0f} target tokens/s over {state.step_seconds:.1f} s of training "
            f"steps{session}; final model in {run.run_dir / 'model'}")
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

