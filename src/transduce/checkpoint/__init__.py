"""Everything a run leaves on disk: model directories, training checkpoints, finding and
averaging them (Section 6.1), and what the MODEL argument of the inference commands names.
Nothing is ever unpickled (tensors are safetensors, everything else JSON); every file is written
whole or not at all and checked against the SHA-256 written with it (`files.verify`).

A model directory::

    model.safetensors   the weights (a shared tensor such as the tied embedding stored once)
    config.json         the `Config`
    checksums.json      SHA-256 and size of the two files above (written last)

A run directory (`transduce train --run-dir`)::

    RUN_DIR/config.json, data.json  the Config and the data's metadata (+ "data_dir")
    RUN_DIR/spm*.model, *.vocab     the vocabulary files, copied: later commands need only RUN_DIR
    RUN_DIR/checkpoints/
        step_0001000/            a model directory, plus:
            optimizer.safetensors  Adam's state, e.g. "exp_avg/encoder.layers.0.norm1.weight"
            rng.safetensors        torch RNG states of every rank, e.g. "cpu/rank0"
            trainer_state.json     step, epoch, schedule, ..., and the SHA-256 and size of every
                                   other file (written last: it marks the checkpoint complete)
        latest                   the name of the newest complete checkpoint
        step_0000900.damaged/    a checkpoint found damaged on --resume, set aside
    RUN_DIR/.lock                held (flock) by the one trainer writing the run
    RUN_DIR/logs/                train.jsonl (one JSON object per event), TensorBoard files
    RUN_DIR/model/, avg_lastK/   the final model, `transduce average`'s output (model directories)
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
