"""Running an experiment: each variant trained (or resumed, or skipped when done) in its own run
directory OUT/runs/NAME, then measured as Table 3 and Table 2 report it (its row.json and
dev.hyp beside it; OUT/experiment.json records the recipe). A run directory or experiment of
another recipe is a one-line error before anything runs: nothing trained is overwritten."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .. import evaluate as bleu
from ..checkpoint import STATE, TrainingState, atomic_write_text, latest_checkpoint
from ..config import Config
from ..data.batching import ParallelDataset, read_metadata
from ..data.text import read_lines
from ..device import resolve_device
from ..errors import DataError, UsageError
from ..flops import dims, matmul_peak, training_flops
from ..model import count_parameters
from ..precision import choose_decoding_precision, choose_precision
from ..decoding.ready import load_translation_model, make_ready
from ..train.state import BatchStream
from ..train.step import evaluate as validation_loss
from ..train.trainer import train
from ..decoding.translate import translate_lines
from .plan import Machine, Recipe, Variant, train_setup

DECODING = {"beam": 4, "alpha": 0.6, "max_len_offset": 50}  # Section 6.1's search, for every row's dev BLEU

EXPERIMENT = "experiment.json"
ROW = "row.json"


# --- checks before anything runs ---------------------------------------------------------------


def check_data(data_dir: Path) -> dict:
    """The prepared data's metadata; a one-line error without a validation split (Table 3 is
    measured on the development set) or without its text (dev BLEU needs the references)."""
    meta = read_metadata(data_dir)
    if meta.get("task") == "parsing":
        raise UsageError(f"{data_dir}: a treebank; Table 3's experiment is translation")
    valid = meta.get("splits", {}).get("valid")
    if valid is None or not (data_dir / "valid.src.idx").is_file():
        raise UsageError(
            f"{data_dir}: no validation split: Table 3 reports perplexity and BLEU on the development "
            "set; prepare the data with one (--valid-src/--valid-tgt, or a dataset that has one)"
        )
    for side in ("src_file", "tgt_file"):
        if not valid.get(side) or not Path(valid[side]).is_file():
            raise DataError(
                f"the validation split's text {valid.get(side)!r} (recorded at prepare time) is missing: "
                "dev BLEU needs it",
                data_dir / "data.json",
            )
    return meta


def open_experiment(out: Path, data_dir: Path, recipe: Recipe, *, write: bool = True) -> None:
    """OUT/experiment.json: written the first time; later, the same recipe and data or a one-line error."""
    path = out / EXPERIMENT
    mine = {"recipe": recipe.to_dict(), "data_dir": str(data_dir.absolute()), "decoding": DECODING}
    if path.is_file():
        have = json.loads(path.read_text(encoding="utf-8"))
        diff = [
            f"{k} {have['recipe'].get(k)!r}, not {v!r}" for k, v in mine["recipe"].items() if have["recipe"].get(k) != v
        ]
        if have.get("data_dir") != mine["data_dir"]:
            diff.append(f"data {have.get('data_dir')}, not {mine['data_dir']}")
        if diff:
            raise UsageError(
                f"{path}: an experiment of another recipe ({'; '.join(diff)}); nothing was changed: "
                "give the same flags, or another --out"
            )
    elif write:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(mine, indent=2) + "\n")


def _rounded_batch(want: int, got: int) -> bool:
    """The trainer rounds tokens per update down to a multiple of processes x update-freq."""
    return any(want // k * k == got for k in range(1, 1025))


def config_differences(have: Config, want: Config) -> list[str]:
    """What differs between a run's recorded config and a variant's, as 'field recorded, not wanted'."""
    diffs = []
    for section in ("model", "train"):
        a, b = dataclasses.asdict(getattr(have, section)), dataclasses.asdict(getattr(want, section))
        for k in b:
            if a[k] != b[k] and not (k == "max_tokens" and _rounded_batch(b[k], a[k])):
                diffs.append(f"{section}.{k} {a[k]!r}, not {b[k]!r}")
    return diffs


def starts(run_dir: Path) -> list[dict]:
    """The "start" records of a run's log (one a session: its options, device, precision)."""
    log = run_dir / "logs" / "train.jsonl"
    if not log.is_file():
        return []
    records = map(json.loads, filter(str.strip, log.read_text(encoding="utf-8").splitlines()))
    return [r for r in records if r.get("type") == "start"]


def check_run_dir(variant: Variant, config: Config, recipe: Recipe, out: Path) -> None:
    """A one-line error if the variant's run directory holds a run of another recipe."""
    run_dir = variant.run_dir(out)
    path = run_dir / "config.json"
    if not path.is_file():
        return
    diffs = config_differences(Config.from_dict(json.loads(path.read_text(encoding="utf-8"))), config)
    for start in starts(run_dir)[:1]:
        for name in ("seed", "cooldown"):
            if start["options"].get(name) != getattr(recipe, name):
                diffs.append(f"{name} {start['options'].get(name)!r}, not {getattr(recipe, name)!r}")
    if diffs:
        raise UsageError(
            f"{path}: a run of another recipe ({'; '.join(diffs[:4])}); nothing was changed: "
            "use another --out, or move that run away"
        )


# --- one variant: train, then measure -----------------------------------------------------------


def trained(run_dir: Path, steps: int) -> bool:
    latest = latest_checkpoint(run_dir)
    return latest is not None and checkpoint_state(latest).step >= steps and (run_dir / "model").is_dir()


def checkpoint_state(path: Path) -> TrainingState:
    return TrainingState.from_json((path / STATE).read_text(encoding="utf-8"))


def made_with(variant: Variant, recipe: Recipe, average: bool) -> dict:
    """What a row's numbers depend on: reused only when this is equal."""
    return {
        "recipe": recipe.to_dict(),
        "decoding": DECODING,
        "average": average,
        "preset": variant.preset,
        "sets": variant.sets,
        "steps": variant.max_steps,
    }


def rows_measured_beside(out: Path, names: list[str], recipe: Recipe, average: bool) -> list[dict]:
    """The rows in OUT but `names` measured under the same recipe, decoding and averaging (by
    another list of variants run side by side); an unreadable or other-recipe row.json left out."""
    rows = []
    for path in sorted((out / "runs").glob(f"*/{ROW}")):
        if path.parent.name in names:
            continue
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        made = row.get("made_with") if isinstance(row, dict) else None
        if (
            isinstance(made, dict)
            and (made.get("recipe"), made.get("decoding"), made.get("average")) == (recipe.to_dict(), DECODING, average)
            and row.get("variant") == path.parent.name
        ):
            rows.append(row)
    return rows


@dataclass
class Outcome:
    row: dict | None  # The measured row; None when training was interrupted (a signal): run again to resume
    what: str  # 'skipped' (done before), 'measured' (trained before), 'trained', 'resumed' or 'interrupted'


def run_variant(
    variant: Variant,
    recipe: Recipe,
    data_dir: Path,
    out: Path,
    machine: Machine,
    meta: dict,
    *,
    average: bool = False,
    peak_flops: float | None = None,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Train `variant` (resuming what was interrupted, skipping what is done), then measure it."""
    run_dir = variant.run_dir(out)
    row_path = run_dir / ROW
    if row_path.is_file():
        row = json.loads(row_path.read_text(encoding="utf-8"))
        if row.get("made_with") == made_with(variant, recipe, average) and trained(run_dir, variant.max_steps):
            return Outcome(row, "skipped")
    what = "measured"  # trained before (by a Slurm job, a printed command, an earlier call), measured now
    if not trained(run_dir, variant.max_steps):
        latest = latest_checkpoint(run_dir)
        what = "resumed" if latest is not None else "trained"
        config, options = train_setup(variant, recipe, meta, machine)
        say(
            f"{variant.name}: {'resuming at step ' + str(checkpoint_state(latest).step) if latest else 'training'} "
            f"-> {variant.max_steps} in {run_dir}"
        )
        result = train(config, data_dir, run_dir, options, log_extra={"experiment": variant.name})
        if result.interrupted:
            return Outcome(None, "interrupted")
    say(
        f"{variant.name}: measuring ({'the average of the last checkpoints' if average else 'the final model'}: "
        "dev perplexity, dev BLEU with beam 4; training FLOPs)"
    )
    row = measure(variant, run_dir, data_dir, meta, machine, average=average, peak_flops=peak_flops)
    row["made_with"] = made_with(variant, recipe, average)
    atomic_write_text(row_path, json.dumps(row, indent=2, ensure_ascii=False) + "\n")
    return Outcome(row, what)


def measure(
    variant: Variant,
    run_dir: Path,
    data_dir: Path,
    meta: dict,
    machine: Machine,
    *,
    average: bool = False,
    peak_flops: float | None = None,
) -> dict:
    """Table 3's row (dev perplexity and BLEU of the final model, 6.2: "no checkpoint averaging";
    with `average`, of the last checkpoints' average) and Table 2's cost (FLOPs, time, MFU)."""
    device = resolve_device(machine.device)
    loaded = load_translation_model(run_dir, checkpoint=None if average else "model", device=device)
    config, m = loaded.config, loaded.config.model
    precision = "fp32" if machine.precision == "fp16" else machine.precision
    valid = validation_loss(
        loaded.model,
        ParallelDataset.load(data_dir, "valid"),
        max_tokens=config.train.max_tokens,
        label_smoothing=config.train.label_smoothing,
        precision=choose_precision(precision, device).precision,
    )
    split = meta["splits"]["valid"]
    srcs, refs = list(read_lines(split["src_file"])), list(read_lines(split["tgt_file"]))
    if len(srcs) != len(refs):
        raise DataError(
            f"{len(srcs)} source lines but {len(refs)} references in {split['tgt_file']}", split["src_file"]
        )
    choice = choose_decoding_precision(precision, device)
    make_ready(loaded.model, choice)  # as `transduce translate --precision` decodes
    hyps = translate_lines(
        loaded.model,
        loaded.src_vocab,
        loaded.tgt_vocab,
        srcs,
        **DECODING,
        bf16=choice.precision == "bf16",
        progress=machine.progress,
        source_name=split["src_file"],
        warn=lambda _: None,
    )
    atomic_write_text(run_dir / "dev.hyp", "".join(h + "\n" for h in hyps))
    scores = bleu.score(hyps, refs, lang=meta.get("tgt_lang") or "en")
    return {
        "variant": variant.name,
        "preset": variant.preset,
        "N": m.n_layers,
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "h": m.n_heads,
        "d_k": m.head_dim_k,
        "d_v": m.head_dim_v,
        "P_drop": m.dropout,
        "eps_ls": config.train.label_smoothing,
        "positional": m.positional,
        "train_steps": variant.max_steps,
        "dev_ppl": valid["ppl"],
        "dev_bleu": scores["sacrebleu"]["score"],
        "dev_bleu_paper": scores["paper_bleu"]["score"],
        "params": count_parameters(loaded.model),
        "model": loaded.description,
        "decoding_precision": choice.precision,
        **cost(config, run_dir, data_dir, peak_flops),
    }


# --- Table 2's columns: training FLOPs, time, device, precision, MFU ------------------------------


def counted_flops(config: Config, run_dir: Path, data_dir: Path) -> tuple[int, TrainingState]:
    """The model FLOPs of the batches the run trained on (`transduce.flops`), its batch order
    replayed from the sizes alone as its latest checkpoint records it (exact unless batching
    changed on a resume, or non-finite steps were skipped)."""
    state = checkpoint_state(latest_checkpoint(run_dir))
    dm = dims(config.model)
    train_set = ParallelDataset.load(data_dir, "train")
    src, tgt = train_set.src_sizes, train_set.tgt_sizes
    total = 0
    for rank in range(state.world_size):
        stream = BatchStream(train_set, state.max_tokens, seed=state.seed, num_shards=state.world_size, shard_id=rank)
        for _ in range(state.step * state.update_freq):
            i = stream.next()
            total += training_flops(dm, len(i), int(src[i].max()), int(tgt[i].max()))
    return total, state


@functools.lru_cache(maxsize=None)
def measured_peak(device: str, precision: str, threads: int | None) -> float | None:
    """This machine's best matmul FLOP/s (`flops.matmul_peak`) in the run's device, precision and
    threads, measured once per process; None where the device is not here."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return None
    n = torch.get_num_threads()
    if threads and dev.type == "cpu":
        torch.set_num_threads(threads)
    try:
        return matmul_peak({"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32), device=dev)
    finally:
        torch.set_num_threads(n)


def cost(config: Config, run_dir: Path, data_dir: Path, peak_flops: float | None) -> dict:
    """Table 2's columns for a run: training FLOPs, wall time (all sessions), device, precision,
    and MFU against `peak_flops` per process or the matmul peak measured here."""
    flops, state = counted_flops(config, run_dir, data_dir)
    sessions = starts(run_dir)
    last = sessions[-1] if sessions else {}
    device, precision = last.get("device", "?"), last.get("precision", "?")
    precisions = sorted({r.get("precision", "?") for r in sessions})
    if peak_flops is not None:
        peak, source = peak_flops, "stated (--peak-tflops)"
    else:
        peak = measured_peak(device, precision, last.get("threads")) if sessions else None
        source = (
            f"measured: best {precision} matmul (2048^3) on this machine, {last.get('threads')} threads"
            if peak
            else "unknown (the device is not here: give --peak-tflops)"
        )
    seconds = state.train_seconds
    mfu = flops / seconds / (peak * state.world_size) if peak and seconds > 0 else None
    return {
        "training_flops": flops,
        "train_seconds": seconds,
        "device": device,
        "precision": "+".join(precisions) if len(precisions) > 1 else precision,
        "processes": state.world_size,
        "target_tokens": state.target_tokens,
        "mfu": mfu,
        "peak_flops": peak,
        "peak_source": source,
        "flops_per_s": flops / seconds if seconds > 0 else math.nan,
    }
