"""A training run up to its first step, in the trainer's order (`transduce.train.trainer.train`):
its config from the prepared data (`config_for_data`: the preset, the data's vocabulary sizes and
special ids, then `--set`), the set-up (`set_up`: threads, precision, the data (5.1), the model
made ready to train, Adam (5.3), the GradScaler), then, once `transduce.train.recovery.restore` has
said where the run starts, the opening (`open_run`: the batch stream at that point, the run
directory, the module that trains, the log and the opening lines, the progress bar, the clocks).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoint import check_vocabulary, latest_checkpoint, prepare_run_dir, recorded_precision
from ..config import PRESETS, Config, apply_overrides, get_preset
from ..data.batching import ParallelDataset, data_special_ids, load_vocabs, read_metadata
from ..errors import UsageError
from ..fast.train import keep_freed_memory
from ..model import Transformer, count_parameters
from . import recovery
from .distributed import DistEnv, set_threads
from .schedule import learning_rate
from .signals import StopSignals
from .state import BatchStream, LoopState, Run, RunLog, TrainOptions
from .step import build_optimizer, make_grad_scaler, prepare_for_training, resolve_precision


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
        config.model,
        src_vocab_size=src_size,
        tgt_vocab_size=None if shared else tgt_size,
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


def set_up(
    config: Config, data_dir: Path, run_dir: Path, given: TrainOptions, env: DistEnv, signals: StopSignals
) -> Run:
    """Device threads, precision, the data, the model made ready to train, Adam, the GradScaler."""
    set_threads(env, given.threads)
    precision = resolve_precision(
        env, given.precision, config.model, recorded=recorded_precision(run_dir) if given.continues else None
    )
    opts = given.resolve(config, env.world_size)

    # Data (5.1).
    meta = read_metadata(data_dir)
    if opts.continues and latest_checkpoint(run_dir) is not None:
        check_vocabulary(run_dir, config, data_dir, meta)
    train_set = ParallelDataset.load(data_dir, "train")
    valid_set = ParallelDataset.load(data_dir, "valid") if (data_dir / "valid.src.idx").is_file() else None
    if train_set.ids != config.model.special_ids:
        raise UsageError(
            f"{data_dir}: its special ids {train_set.ids.to_dict()} are not the model's "
            f"{config.model.special_ids.to_dict()}: prepare the data with the model's vocabulary"
        )

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
        config=config,
        opts=opts,
        env=env,
        data_dir=data_dir,
        run_dir=run_dir,
        precision=precision,
        smooth_exclude=() if config.train.smooth_all_classes else (ids.pad, ids.bos),  # 5.4: what is never emitted
        meta=meta,
        train_set=train_set,
        valid_set=valid_set,
        model=model,
        optimizer=build_optimizer(model, config),
        scaler=make_grad_scaler(env.device, precision),
        signals=signals,
    )


def open_run(run: Run, start: recovery.Start, given: TrainOptions, log_extra: dict) -> tuple[Run, LoopState]:
    """Start the batch stream at `start`, write the run directory (rank 0), make the module that
    trains (optionally compiled, in DDP for several processes), open the log, say what will be
    done, open the progress bar; the loop's clocks start."""
    env, opts, config = run.env, run.opts, run.config
    t = config.train
    if start.step > t.max_steps:  # before anything is written: the run is not rewound, nor its model rewritten
        raise UsageError(
            f"{run.run_dir} is already at step {start.step}, past --max-steps {t.max_steps}: nothing "
            "was trained (a larger --max-steps continues it)"
        )
    stream = BatchStream(
        run.train_set,
        opts.max_tokens,
        seed=opts.seed,
        num_shards=env.world_size,
        shard_id=env.rank,
        epoch=start.epoch,
        position=start.position,
    )  # first: it refuses an empty split
    if env.is_main:
        if opts.restart:  # the new run has started: the earlier run's checkpoints go now, not before
            recovery.replace_previous(run.run_dir, env)
        prepare_run_dir(run.run_dir, run.data_dir, run.meta, config)
    run.model.train()
    train_model: nn.Module = torch.compile(run.model) if opts.compile else run.model
    if env.distributed:
        train_model = nn.parallel.DistributedDataParallel(
            train_model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
    run = dataclasses.replace(
        run, train_model=train_model, log=RunLog(run.run_dir / "logs", opts.tensorboard) if env.is_main else None
    )
    _announce(run, stream, start.step, given, log_extra)  # before the bar: on a terminal, not on the bar's line
    if env.is_main and opts.progress and sys.stderr.isatty():
        from tqdm import tqdm

        run = dataclasses.replace(
            run, bar=tqdm(total=t.max_steps, initial=start.step, unit="step", dynamic_ncols=True, desc="train")
        )
    now = time.perf_counter()
    return run, LoopState(
        step=start.step,
        stream=stream,
        lr=learning_rate(
            start.step, config.model.d_model, t.warmup_steps, t.lr_scale, cooldown=opts.cooldown, max_steps=t.max_steps
        ),
        stop=start.step >= t.max_steps,
        train_seconds=start.train_seconds,
        tokens_seen=start.target_tokens,
        saved_at=start.saved_at,
        first_step=start.step,
        start=now,
        last_save=now,
        last_log=now,
        interval_sums=torch.zeros(2, device=env.device),
    )


def _announce(run: Run, stream: BatchStream, step: int, given: TrainOptions, log_extra: dict) -> None:
    """The log's "start" record and the opening lines."""
    env, opts, config = run.env, run.opts, run.config
    n_params = count_parameters(run.model)
    if not config.model.share_embeddings:  # 3.4's three-way tying needs one vocabulary: say what is shared
        env.say(
            "note: separate source and target vocabularies (or model.share_embeddings=false): the source "
            "embedding is its own matrix; the target embedding and the pre-softmax projection are "
            + ("tied (model.tie_output)" if config.model.tie_output else "separate too (model.tie_output=false)")
        )
    if run.log is not None:
        run.log.write(
            "start",
            step,
            parameters=n_params,
            world_size=env.world_size,
            device=str(env.device),
            precision=run.precision,
            max_tokens_per_batch=opts.max_tokens,
            update_freq=opts.update_freq,
            batches_per_epoch=len(stream) * env.world_size,
            threads=torch.get_num_threads(),
            restart=env.restart,
            config=config.to_dict(),
            options=dataclasses.asdict(given),
            **log_extra,
        )
    if env.restart:  # torchrun --max-restarts: the workers were started again after a failure
        env.say(
            f"torchrun restart {env.restart}: "
            + (f"resuming at step {step}" if step else "starting afresh (no checkpoint)")
        )
    env.say(
        f"training {n_params / 1e6:.1f}M parameters on {env.world_size} x {env.device} ({run.precision}), "
        f"step {step} -> {config.train.max_steps}, {opts.max_tokens} tokens x {opts.update_freq} micro-batches x "
        f"{env.world_size} processes per step; {len(stream) * env.world_size} batches per epoch"
    )
