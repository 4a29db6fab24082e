"""Everything a run leaves on disk: model directories, training checkpoints, finding and
averaging them (Section 6.1), and what the MODEL argument of the inference commands names.
Nothing is ever unpickled (tensors are safetensors, everything else JSON); every file is written
whole or not at all and checked against the SHA-256 written with it (`files.verify`). The layout
of model and run directories: docs/training.md, "What a run leaves on disk".
"""

from __future__ import annotations

from .files import (  # noqa: F401
    CHECKPOINTS,
    CHECKSUMS,
    CONFIG,
    DAMAGED,
    FORMAT,
    LATEST,
    LOCK,
    OPTIMIZER,
    RNG,
    STATE,
    WEIGHTS,
    DamagedCheckpoint,
    as_os_error,
    atomic_dir,
    atomic_write_text,
    digests,
    expected_digests,
    file_digest,
    fsync_dir,
    save_tensors,
    synced,
    verify,
)
from .model_dir import (  # noqa: F401
    guarded,
    is_model_dir,
    load_config,
    load_model,
    model_from_tensors,
    save_made_tensors_as_model,
    save_model,
    save_tensors_as_model,
)
from .run_dir import (  # noqa: F401
    LoadedCheckpoint,
    RunLock,
    RunLocked,
    TrainingState,
    check_vocabulary,
    checkpoint_name,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_optimizer_tensors,
    on_interval,
    optimizer_tensors,
    prepare_run_dir,
    recorded_precision,
    save_checkpoint,
    set_aside,
)
from .averaging import (  # noqa: F401
    NOT_A_MODEL,
    Resolved,
    average_checkpoints,
    check_model_path,
    default_average,
    last_checkpoints,
    load_for_inference,
    resolve_checkpoint,
)
