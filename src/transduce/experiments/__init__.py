"""Table 3 and Table 2 as an experiment anyone can rerun: `transduce experiment`.

Each variant (a Table 3 row, a preset) is an ordinary `transduce train` run under a shared
`plan.Recipe`, optionally at a stated reduced scale; `run` trains and measures it, `table` writes
the results. Details: docs/experiments.md.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from ..extras import require
from .plan import TABLE3, Machine, Recipe, Variant, plan, train_command, train_setup
from .run import check_data, check_run_dir, open_experiment, rows_measured_beside, run_variant, trained
from .table import write_table

__all__ = ["TABLE3", "Machine", "Recipe", "Variant", "Report", "prepare", "dry_run", "run_experiment", "submit_slurm"]


@dataclass
class Report:
    rows: list[dict] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # Variant -> its `run.Outcome.what`
    written: list[Path] = field(default_factory=list)
    interrupted: bool = False


def prepare(
    data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine
) -> tuple[dict, list[Variant]]:
    """(metadata, variants), every check made first: the data, the names, OUT's runs' recipes."""
    meta = check_data(data_dir)
    variants = plan(names, recipe)
    open_experiment(out, data_dir, recipe, write=False)
    for v in variants:
        check_run_dir(v, train_setup(v, recipe, meta, machine)[0], recipe, out)
    return meta, variants


def dry_run(data_dir: Path, out: Path, names: list[str], recipe: Recipe, machine: Machine) -> list[str]:
    """The `transduce train` command of every variant, as lines for a shell; writes nothing."""
    _, variants = prepare(data_dir, out, names, recipe, machine)
    return [shlex.join(train_command(v, recipe, data_dir, out, machine)) for v in variants]


def run_experiment(
    data_dir: Path,
    out: Path,
    names: list[str],
    recipe: Recipe,
    machine: Machine,
    *,
    average: bool = False,
    peak_flops: float | None = None,
    say: Callable[[str], None] = print,
) -> Report:
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


def submit_slurm(
    data_dir: Path,
    out: Path,
    names: list[str],
    recipe: Recipe,
    machine: Machine,
    *,
    partition: str | None,
    minutes: int,
    cpus_per_task: int | None = None,
    cluster: str | None = None,
) -> dict:
    """Submit each variant not yet trained as a Slurm job running its `transduce train` command,
    through submitit (logs in OUT/slurm); returns {variant: submitit job}."""
    submitit = require("submitit", "--slurm")
    if cluster is None:  # submitit's own choice would be its local executor where there is no Slurm
        if shutil.which("sbatch") is None:
            raise UsageError(
                "--slurm: no Slurm here (sbatch is not on PATH); train here without --slurm, "
                "or run --dry-run's commands where you can"
            )
        cluster = "slurm"
    _, variants = prepare(data_dir, out, names, recipe, machine)
    open_experiment(out, data_dir, recipe)
    executor = submitit.AutoExecutor(folder=str(out / "slurm"), cluster=cluster)
    params = dict(
        timeout_min=minutes, tasks_per_node=1, nodes=1, gpus_per_node=machine.nproc if machine.device != "cpu" else 0
    )
    if partition:
        params["slurm_partition"] = partition
    if cpus_per_task:
        params["cpus_per_task"] = cpus_per_task
    jobs = {}
    for v in variants:
        if trained(v.run_dir(out), v.max_steps):
            continue
        executor.update_parameters(name=f"transduce-{v.name}", **params)
        jobs[v.name] = executor.submit(
            submitit.helpers.CommandFunction(train_command(v, recipe, data_dir, out, machine))
        )
    return jobs
