"""Everything a run leaves on disk, in one place: model directories, training checkpoints,
finding them, averaging them (Section 6.1), and resolving the MODEL argument of the inference
commands. Training and inference both read and write through this package; nothing is ever
unpickled (tensors are safetensors, everything else JSON). Its rooms:

    files.py      file names, atomic writes, checksums (`verify`, `DamagedCheckpoint`)
    model_dir.py  model directories: `save_model`, `load_model`
    run_dir.py    a training run's directory: `prepare_run_dir`, training checkpoints
                  (`save_checkpoint`, `load_checkpoint`, `latest_checkpoint`, ...), `RunLock`
    averaging.py  6.1's averaging, and what a MODEL argument names (`load_for_inference`)

Every public name is importable from `transduce.checkpoint` itself.

A model directory (what `translate`, `evaluate` and `average` read and write)::

    model.safetensors   the weights (a shared tensor such as the tied embedding stored once)
    config.json         the `Config` (model architecture and training regime)
    checksums.json      SHA-256 and size of the two files above (written last)

A run directory (`transduce train --run-dir`)::

    RUN_DIR/config.json          the Config the run uses
    RUN_DIR/data.json            the data's metadata (+ "data_dir": where it was read from)
    RUN_DIR/spm*.model, *.vocab  the vocabulary files, copied: later commands need only RUN_DIR
    RUN_DIR/checkpoints/
        step_0001000/            a model directory, plus:
            optimizer.safetensors  Adam's state, one tensor per (state name, parameter name),
                                   e.g. "exp_avg/encoder.layers.0.norm1.weight"
            rng.safetensors        torch RNG states of every rank (uint8 tensors), e.g. "cpu/rank0"
            trainer_state.json     step, epoch, position in the epoch, schedule, GradScaler, ...,
                                   and the SHA-256 and size of every other file (written last)
        latest                   one line: the name of the newest complete checkpoint
        step_0000900.damaged/    a checkpoint found damaged on --resume, set aside (never deleted)
    RUN_DIR/.lock                held (flock) by the one trainer writing the run; says who it is
    RUN_DIR/logs/train.jsonl     one JSON object per line: start, train, valid, checkpoint, end
    RUN_DIR/logs/                TensorBoard event files (if tensorboard is installed)
    RUN_DIR/model/               the final model (a model directory)
    RUN_DIR/avg_lastK/           `transduce average`'s output (a model directory)

Atomicity: every file is written to a temporary name, fsync'ed and moved into place with
`os.replace`. A checkpoint is written into a hidden temporary directory (`.tmp-step_...`) and
renamed into place whole; only then is `latest` rewritten. A crash at any moment leaves `latest`
pointing at a complete checkpoint; half-written temporary directories are ignored (and removed by
the next successful save).

Integrity: loading verifies every file against the checksums written beside it (`verify`); a
damaged file (truncated by a full disk, a flipped bit) is a one-line `DamagedCheckpoint` error
naming the file. `transduce train --resume` then falls back to the newest intact checkpoint
(`transduce.train.recovery.load_newest_intact`). One writer: a trainer holds `RUN_DIR/.lock` (`RunLock`) for as long as it runs.

Section 6.1: "For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we averaged the last
20 checkpoints." `last_checkpoints` takes the last K written at the interval (a checkpoint forced
off it, at the end of a run, is left out), `average_checkpoints` their elementwise mean, and a
run directory given to an inference command means that average (`load_for_inference`).
"""

from __future__ import annotations

from .files import (  # noqa: F401
    CHECKPOINTS, CHECKSUMS, CONFIG, DAMAGED, FORMAT, LATEST, LOCK, OPTIMIZER, RNG, STATE, WEIGHTS,
    DamagedCheckpoint, as_os_error, atomic_dir, atomic_write_text, digests, expected_digests,
    file_digest, fsync_dir, readable, save_tensors, verify,
)
from .model_dir import (  # noqa: F401
    guarded, is_model_dir, load_config, load_model, model_from_tensors, save_model,
    save_tensors_as_model,
)
from .run_dir import (  # noqa: F401
    LoadedCheckpoint, RunLock, RunLocked, TrainingState, check_vocabulary, checkpoint_name, checkpoint_step,
    latest_checkpoint, list_checkpoints, load_checkpoint, load_optimizer_tensors, on_interval,
    optimizer_tensors, prepare_run_dir, recorded_precision, save_checkpoint, set_aside,
)
from .averaging import (  # noqa: F401
    NOT_A_MODEL, Resolved, average_checkpoints, check_model_path, default_average, last_checkpoints,
    load_for_inference, resolve_checkpoint,
)
