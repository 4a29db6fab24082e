"""Running an experiment: each variant trained (or resumed, or skipped when done) in its own run
directory, then measured as Table 3 and Table 2 report it.

    OUT/experiment.json     the recipe and the data (a second run with another recipe is refused)
    OUT/runs/NAME/          an ordinary `transduce train` run directory per variant, plus
        row.json            its measured row (reused when the recipe and decoding are the same)
        dev.hyp             its translations of the development set
    OUT/table.md, .csv, .json, .png   the table (`transduce.experiments.table`)

Nothing trained is overwritten: a run directory whose config.json (or seed, cooldown) is not the
variant's under this recipe is a one-line error before anything runs.
"""

from __future__ import annotations

import dataclasses
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
from ..precision import choose_precision
from ..train.state import BatchStream
from ..train.step import evaluate as validation_loss
from ..train.trainer import train
from ..translate import AtomicOutput, load_translation_model, translate_lines
from .plan import Machine, Recipe, Variant, train_setup

DECODING = {"beam": 4, "alpha": 0.6, "max_len_offset": 50}
"""Section 6.1's search, for the development BLEU of every row: beam 4, length penalty 0.6,
maximum output length input + 50."""

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
        raise UsageError(f"{data_dir}: no validation split: Table 3 reports perplexity and BLEU on the development "
                         "set; prepare the data with one (--valid-src/--valid-tgt, or a dataset that has one)")
    for side in ("src_file", "tgt_file"):
        if not valid.get(side) or not Path(valid[side]).is_file():
            raise DataError(f"the validation split's text {valid.get(side)!r} (recorded at prepare time) is missing: "
                            "dev BLEU needs it", data_dir / "data.json")
    return meta


def open_experiment(out: Path, data_dir: Path, recipe: Recipe, *, write: bool = True) -> None:
    """OUT/experiment.json: written the first time; later, the same recipe and data or a one-line
    error (another recipe needs another OUT)."""
    path = out / EXPERIMENT
    mine = {"recipe": recipe.to_dict(), "data_dir": str(data_dir.absolute()), "decoding": DECODING}
    if path.is_file():
        have = json.loads(path.read_text(encoding="utf-8"))
        diff = [f"{k} {have['recipe'].get(k)!r}, not {v!r}" for k, v in mine["recipe"].items()
                if have["recipe"].get(k) != v]
        if have.get("data_dir") != mine["data_dir"]:
            diff.append(f"data {have.get('data_dir')}, not {mine['data_dir']}")
        if diff:
            raise UsageError(f"{path}: an experiment of another recipe ({'; '.join(diff)}); nothing was changed: "
                             "give the same flags, or another --out")
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


def first_start(run_dir: Path) -> dict | None:
    """The first "start" record of a run's log (its options), if any."""
    log = run_dir / "logs" / "train.jsonl"
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("type") == "start":
                return record
    return None


def check_run_dir(variant: Variant, config: Config, recipe: Recipe, out: Path) -> None:
    """A one-line error if the variant's run directory holds a run of another recipe."""
    run_dir = variant.run_dir(out)
    path = run_dir / "config.json"
    if not path.is_file():
        return
    diffs = config_differences(Config.from_dict(json.loads(path.read_text(encoding="utf-8"))), config)
    start = first_start(run_dir)
    if start is not None:
        for name in ("seed", "cooldown"):
            if start["options"].get(name) != getattr(recipe, name):
                diffs.append(f"{name} {start['options'].get(name)!r}, not {getattr(recipe, name)!r}")
    if diffs:
        raise UsageError(f"{path}: a run of another recipe ({'; '.join(diffs[:4])}); nothing was changed: "
                         "use another --out, or move that run away")


# --- one variant: train, then measure -----------------------------------------------------------


def trained(run_dir: Path, steps: int) -> bool:
    latest = latest_checkpoint(run_dir)
    return latest is not None and checkpoint_state(latest).step >= steps and (run_dir / "model").is_dir()


def checkpoint_state(path: Path) -> TrainingState:
    return TrainingState.from_json((path / STATE).read_text(encoding="utf-8"))


def made_with(variant: Variant, recipe: Recipe, average: bool) -> dict:
    """What a row's numbers depend on: reused only when this is equal."""
    return {"recipe": recipe.to_dict(), "decoding": DECODING, "average": average, "preset": variant.preset,
            "sets": variant.sets, "steps": variant.max_steps}


def rows_measured_beside(out: Path, names: list[str], recipe: Recipe, average: bool) -> list[dict]:
    """The rows in OUT that other calls measured under the same recipe, decoding and averaging
    (another list of variants run side by side into the same OUT), except `names`; in Table 3's
    order. An unreadable or other-recipe row.json is left out."""
    rows = []
    for path in sorted((out / "runs").glob(f"*/{ROW}")):
        if path.parent.name in names:
            continue
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        made = row.get("made_with") if isinstance(row, dict) else None
        if isinstance(made, dict) and (made.get("recipe"), made.get("decoding"), made.get("average")) \
                == (recipe.to_dict(), DECODING, average) and row.get("variant") == path.parent.name:
            rows.append(row)
    return rows


@dataclass
class Outcome:
    row: dict | None
    """The measured row; None when training was interrupted (a signal): resume by running again."""
    what: str
    """'skipped' (trained and measured before), 'measured' (trained before), 'trained', 'resumed' or
    'interrupted'."""


def run_variant(variant: Variant, recipe: Recipe, data_dir: Path, out: Path, machine: Machine, meta: dict,
                *, average: bool = False, peak_flops: float | None = None,
                say: Callable[[str], None] = print) -> Outcome:
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
        say(f"{variant.name}: {'resuming at step ' + str(checkpoint_state(latest).step) if latest else 'training'} "
            f"-> {variant.max_steps} in {run_dir}")
        result = train(config, data_dir, run_dir, options, log_extra={"experiment": variant.name})
        if result.interrupted:
            return Outcome(None, "interrupted")
    say(f"{variant.name}: measuring ({'the average of the last checkpoints' if average else 'the final model'}: "
        "dev perplexity, dev BLEU with beam 4; training FLOPs)")
    row = measure(variant, run_dir, data_dir, meta, machine, average=average, peak_flops=peak_flops)
    row["made_with"] = made_with(variant, recipe, average)
    atomic_write_text(row_path, json.dumps(row, indent=2, ensure_ascii=False) + "\n")
    return Outcome(row, what)


def measure(variant: Variant, run_dir: Path, data_dir: Path, meta: dict, machine: Machine,
            *, average: bool = False, peak_flops: float | None = None) -> dict:
    """Table 3's row (dev perplexity and BLEU, with 6.1's beam search, of the final model as 6.2
    says: "no checkpoint averaging"; with `average`, of the average of the last checkpoints as
    6.1 does for Table 2) and Table 2's cost (training FLOPs, time, device, precision, MFU)."""
    device = resolve_device(machine.device)
    loaded = load_translation_model(run_dir, checkpoint=None if average else "model", device=device)
    config, m = loaded.config, loaded.config.model
    choice = choose_precision("fp32" if machine.precision == "fp16" else machine.precision, device,
                              d_model=m.d_model, d_ff=m.d_ff)
    valid = validation_loss(loaded.model, ParallelDataset.load(data_dir, "valid"), max_tokens=config.train.max_tokens,
                            label_smoothing=config.train.label_smoothing, precision=choice.precision)
    split = meta["splits"]["valid"]
    srcs, refs = list(read_lines(split["src_file"])), list(read_lines(split["tgt_file"]))
    if len(srcs) != len(refs):
        raise DataError(f"{len(srcs)} source lines but {len(refs)} references in {split['tgt_file']}", split["src_file"])
    bf16 = choice.precision == "bf16"
    if bf16:
        loaded.model.to(torch.bfloat16)
    hyps = translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, srcs, **DECODING, bf16=bf16,
                           progress=machine.progress, source_name=split["src_file"], warn=lambda _: None)
    out = AtomicOutput(run_dir / "dev.hyp")
    out.write("".join(h + "\n" for h in hyps).encode("utf-8"))
    out.commit()
    scores = bleu.score(hyps, refs, lang=meta.get("tgt_lang") or "en")
    return {
        "variant": variant.name, "preset": variant.preset,
        "N": m.n_layers, "d_model": m.d_model, "d_ff": m.d_ff, "h": m.n_heads, "d_k": m.head_dim_k,
        "d_v": m.head_dim_v, "P_drop": m.dropout, "eps_ls": config.train.label_smoothing,
        "positional": m.positional, "train_steps": variant.max_steps,
        "dev_ppl": valid["ppl"], "dev_bleu": scores["sacrebleu"]["score"], "dev_bleu_paper": scores["paper_bleu"]["score"],
        "params": count_parameters(loaded.model), "model": loaded.description,
        "decoding_precision": choice.precision, **cost(config, run_dir, data_dir, peak_flops),
    }


# --- Table 2's columns: training FLOPs, time, device, precision, MFU ------------------------------


def counted_flops(config: Config, run_dir: Path, data_dir: Path) -> tuple[int, TrainingState]:
    """The model FLOPs of the batches the run trained on (`transduce.flops`), counted by
    replaying its batch order from the sizes alone: the same seed, tokens per batch, processes
    and micro-batches as its latest checkpoint records (exact unless batching changed on a
    resume, or steps were skipped for non-finite values)."""
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


_PEAKS: dict[tuple[str, str, int], float] = {}


def measured_peak(device: str, precision: str, threads: int | None) -> float | None:
    """The best matmul FLOP/s of this machine in the run's device, precision and threads
    (`flops.matmul_peak`), measured once per process; None where the device is not here."""
    key = (device, precision, threads or 0)
    if key not in _PEAKS:
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            return None
        n = torch.get_num_threads()
        if threads and dev.type == "cpu":
            torch.set_num_threads(threads)
        try:
            _PEAKS[key] = matmul_peak({"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32),
                                      device=dev)
        finally:
            torch.set_num_threads(n)
    return _PEAKS[key]


def cost(config: Config, run_dir: Path, data_dir: Path, peak_flops: float | None) -> dict:
    """Table 2's columns for a run, measured: training FLOPs, wall time (all sessions, validation
    and checkpoints included), device, precision, and MFU against `peak_flops` per process
    (stated) or the matmul peak measured here."""
    flops, state = counted_flops(config, run_dir, data_dir)
    log = run_dir / "logs" / "train.jsonl"
    starts = [r for r in map(json.loads, filter(str.strip, log.read_text(encoding="utf-8").splitlines()))
              if r.get("type") == "start"] if log.is_file() else []
    last = starts[-1] if starts else {}
    device, precision = last.get("device", "?"), last.get("precision", "?")
    precisions = sorted({r.get("precision", "?") for r in starts})
    if peak_flops is not None:
        peak, source = peak_flops, "stated (--peak-tflops)"
    else:
        peak = measured_peak(device, precision, last.get("threads")) if starts else None
        source = (f"measured: best {precision} matmul (2048^3) on this machine, {last.get('threads')} threads"
                  if peak else "unknown (the device is not here: give --peak-tflops)")
    seconds = state.train_seconds
    mfu = flops / seconds / (peak * state.world_size) if peak and seconds > 0 else None
    return {"training_flops": flops, "train_seconds": seconds, "device": device,
            "precision": "+".join(precisions) if len(precisions) > 1 else precision, "processes": state.world_size,
            "target_tokens": state.target_tokens, "mfu": mfu, "peak_flops": peak, "peak_source": source,
            "flops_per_s": flops / seconds if seconds > 0 else math.nan}
