"""Table 3 and Table 2 as an experiment anyone can rerun: `transduce experiment`.

Table 3 ("Variations on the Transformer architecture") trains the base model and its variations
(A: heads and d_k, d_v at constant computation; B: smaller d_k; C: depth and widths; D: dropout
and label smoothing; E: learned positions; big) and reports, on the development set, perplexity
per subword token and BLEU: "We used beam search as described in the previous section, but no
checkpoint averaging" (Section 6.2). So here by default: the final model of each run, beam 4,
alpha 0.6, maximum length input + 50 (6.1); `average=True` (--average) measures the average of
the last checkpoints instead (6.1: 5, big 20), as Table 2's models were. Table 2 reports the
training cost of each model in FLOPs; here the cost is counted from the batches each run trained
on (`transduce.flops`), with the wall time, the device, the precision and the model-FLOPs
utilisation.

    transduce experiment --data data/m30k --out exp/t3 --updates 2000 --scale 0.25 --variants base,A1,C1,big
    transduce experiment ... --dry-run        # the `transduce train` commands, one per variant

The pieces, each reusing the pipeline (prepare -> train -> average -> decode -> score):

* `plan`: the variants (Table 3's rows are presets of `transduce.config.PRESETS`), the `Recipe`
  they share (updates, tokens per update, schedule; never minutes), the scale (every width and
  depth times a stated factor for a smaller machine, the ratios between rows kept, the output
  saying it is not the paper's scale), and each variant's `transduce train` command.
* `run`: each variant is an ordinary `transduce train` run in OUT/runs/NAME, trained through
  `transduce.train.trainer.train` (what the command calls), resumed if interrupted, skipped if
  done; then its final model (or the average of its last checkpoints, `transduce.checkpoint`,
  6.1) loaded as `transduce translate` loads it, its dev perplexity
  (`transduce.train.step.evaluate`), its dev translations (`transduce.translate`) and BLEU
  (`transduce.evaluate`), its cost.
* `table`: Markdown, CSV, JSON and a PNG.

Beyond one machine: `--dry-run` prints the commands (torchrun lines with --nproc); `--slurm`
submits each as a Slurm job through `submitit` (the `slurm` extra); then the same
`transduce experiment` command measures the finished runs and writes the table.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from ..extras import require
from .plan import TABLE3, Machine, Recipe, Variant, plan, show, train_command, train_setup
from .run import check_data, check_run_dir, open_experiment, rows_measured_beside, run_variant, trained
from .table import write_table

__all__ = ["TABLE3", "Machine", "Recipe", "Variant", "Report", "prepare", "dry_run", "run_experiment", "submit_slurm"]


@dataclass
class Report:
    rows: list[dict] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    """Variant -> 'skipped', 'measured', 'trained', 'resumed' or 'interrupted' (`run.Outcome`)."""
    written: list[Path] = field(default_factory=list)
    interrupted: bool = False


def prepare(data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine) -> tuple[dict, list[Variant]]:
    """Every check before anything runs: the data (with a validation split), the variants' names,
    and that no run directory under OUT holds a run of another recipe. Returns (metadata, variants)."""
    meta = check_data(data_dir)
    variants = plan(names, recipe)
    open_experiment(out, data_dir, recipe, write=False)
    for v in variants:
        check_run_dir(v, train_setup(v, recipe, meta, machine)[0], recipe, out)
    return meta, variants


def dry_run(data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine) -> list[str]:
    """The `transduce train` command of every variant, as lines for a shell; writes nothing."""
    _, variants = prepare(data_dir, out, names, recipe, machine)
    return [show(train_command(v, recipe, data_dir, out, machine)) for v in variants]


def run_experiment(data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine, *,
                   average: bool = False, peak_flops: float | None = None,
                   say: Callable[[str], None] = print) -> Report:
    """Train and measure every variant in turn (Table 3), writing the table after each; stops at
    an interrupted run (a signal), which the same call resumes."""
    meta, variants = prepare(data_dir, out, names, recipe, machine)
    open_experiment(out, data_dir, recipe)
    say(f"experiment: {len(variants)} variants, {recipe.scale_note()}")
    report = Report()
    for i, v in enumerate(variants, 1):
        say(f"experiment: [{i}/{len(variants)}] {v.name} ({v.preset}, {v.max_steps:,} updates)")
        outcome = run_variant(v, recipe, data_dir, out, machine, meta, average=average, peak_flops=peak_flops, say=say)
        report.outcomes[v.name] = outcome.what
        if outcome.row is None:
            report.interrupted = True
            break
        report.rows.append(outcome.row)
        if outcome.what == "skipped":
            say(f"{v.name}: done before, skipped")
        # with the rows that another list of variants, run side by side into OUT, has measured
        beside = rows_measured_beside(out, [v.name for v in variants], recipe, average)
        order = {name: i for i, name in enumerate(TABLE3)}
        rows = sorted(report.rows + beside, key=lambda r: (order.get(r["variant"], len(order)), r["variant"]))
        report.written = write_table(out, rows, recipe, data_dir, len(variants) + len(beside), average)
    return report


def submit_slurm(data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine, *,
                 partition: str | None, minutes: int, cpus_per_task: int | None = None, cluster: str | None = None) -> dict:
    """Submit each variant not yet trained as one Slurm job running its `transduce train` command
    (torchrun for --nproc > 1), through submitit's AutoExecutor (logs in OUT/slurm). Returns
    {variant: submitit job} (`.job_id`, `.result()`). Run `transduce experiment` again, without
    --slurm, to measure them."""
    submitit = require("submitit", "--slurm")
    if cluster is None:  # submitit's own choice would be its local executor where there is no Slurm
        if shutil.which("sbatch") is None:
            raise UsageError("--slurm: no Slurm here (sbatch is not on PATH); train here without --slurm, "
                             "or run --dry-run's commands where you can")
        cluster = "slurm"
    _, variants = prepare(data_dir, out, names, recipe, machine)
    open_experiment(out, data_dir, recipe)
    executor = submitit.AutoExecutor(folder=str(out / "slurm"), cluster=cluster)
    params = dict(timeout_min=minutes, tasks_per_node=1, nodes=1, gpus_per_node=machine.nproc if machine.device != "cpu" else 0)
    if partition:
        params["slurm_partition"] = partition
    if cpus_per_task:
        params["cpus_per_task"] = cpus_per_task
    jobs = {}
    for v in variants:
        if trained(v.run_dir(out), v.max_steps):
            continue
        executor.update_parameters(name=f"transduce-{v.name}", **params)
        job = executor.submit(submitit.helpers.CommandFunction(train_command(v, recipe, data_dir, out, machine)))
        jobs[v.name] = job
    return jobs
