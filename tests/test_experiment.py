"""`transduce experiment` (Tables 2 and 3): a tiny two-variant experiment end to end, skipping
what is done, resuming what was interrupted (to the same weights), refusing another recipe; the
FLOPs column against the tested formula; the dry run's commands against the run done in-process;
the one-line errors."""

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tiny_models import SRC_WORDS, TGT_WORDS, sentences
from transduce import flops
from transduce.checkpoint import load_config
from transduce.cli import build_parser, main
from transduce.cli import train as train_cli
from transduce.cli.fields import from_args
from transduce.data.batching import ParallelDataset, read_metadata
from transduce.errors import UsageError
from transduce.experiments import Machine, Recipe, plan, submit_slurm
from transduce.experiments.plan import scaled_sets, train_setup
from transduce.train.trainer import TrainOptions

pytestmark = pytest.mark.usefixtures("one_thread")

# base: d_model 512 / 32 = 16, d_ff 64, h 8 with d_k = d_v = 2, N = 6 / 6 = 1; C6: d_ff 1024 / 32 = 32.
RECIPE = [
    "--max-steps",
    "4",
    "--update-tokens",
    "256",
    "--warmup",
    "2",
    "--save-every-steps",
    "2",
    "--scale",
    "0.03125",
    "--depth-scale",
    "0.1667",
]
MACHINE = ["--device", "cpu", "--precision", "fp32", "--threads", "1", "--quiet"]
PEAK_TFLOPS = 0.05


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Prepared data (a real BPE vocabulary) with a validation split, as `transduce prepare` writes."""
    root = tmp_path_factory.mktemp("exp-data")
    for split, n, seed in (("train", 160, 0), ("valid", 12, 7)):
        (root / f"{split}.en").write_text("\n".join(sentences(SRC_WORDS, n, seed)) + "\n")
        (root / f"{split}.de").write_text("\n".join(sentences(TGT_WORDS, n, seed)) + "\n")
    out = root / "prepared"
    assert (
        main(
            [
                "prepare",
                "--train-src",
                str(root / "train.en"),
                "--train-tgt",
                str(root / "train.de"),
                "--valid-src",
                str(root / "valid.en"),
                "--valid-tgt",
                str(root / "valid.de"),
                "--src",
                "en",
                "--tgt",
                "de",
                "--vocab-size",
                "80",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    return out


def experiment(data, out, *extra, variants="base,C6"):
    return main(
        [
            "experiment",
            "--data",
            str(data),
            "--out",
            str(out),
            "--variants",
            variants,
            *RECIPE,
            *MACHINE,
            "--peak-tflops",
            str(PEAK_TFLOPS),
            *extra,
        ]
    )


def weights(run_dir):
    return load_file(str(run_dir / "model" / "model.safetensors"))


def expected_flops(data, run_dir, steps):
    """3x `flops.forward_flops` of the padded shapes of the first `steps` batches the trainer
    takes (epoch 0's shuffled token-budget batches of the run's seed), counted here independently."""
    config = load_config(run_dir)
    train = ParallelDataset.load(data, "train")
    batches = train.batches(config.train.max_tokens, seed=1, epoch=0, shuffle=True)[:steps]
    dm = flops.dims(config.model)
    return sum(
        3 * flops.forward_flops(dm, len(b), int(train.src_sizes[b].max()), int(train.tgt_sizes[b].max()))
        for b in batches
    )


def test_two_variants_end_to_end_then_skipped_resumed_and_another_recipe_refused(data, tmp_path, capsys):
    out = tmp_path / "exp"
    assert experiment(data, out) == 0
    assert "2 rows: base trained, C6 trained" in capsys.readouterr().out
    table = json.loads((out / "table.json").read_text())
    assert table["reduced_scale"] and "REDUCED SCALE, not the paper's" in (out / "table.md").read_text()
    assert (out / "table.png").read_bytes()[:4] == b"\x89PNG" and (out / "table.csv").read_text().count("\n") == 3
    rows = {r["variant"]: r for r in table["rows"]}
    assert (
        rows["base"]["N"],
        rows["base"]["d_model"],
        rows["base"]["d_ff"],
        rows["base"]["h"],
        rows["base"]["d_k"],
    ) == (1, 16, 64, 8, 2)
    assert rows["C6"]["d_ff"] == 32 and rows["C6"]["params"] < rows["base"]["params"]
    for name, r in rows.items():
        run_dir = out / "runs" / name
        assert r["train_steps"] == 4 and r["model"] == str(run_dir / "model")  # 6.2: the final model
        assert r["training_flops"] == expected_flops(data, run_dir, 4)
        assert r["mfu"] == pytest.approx(r["training_flops"] / r["train_seconds"] / (PEAK_TFLOPS * 1e12))
        assert r["dev_ppl"] > 1 and 0 <= r["dev_bleu"] <= 100 and (r["device"], r["precision"]) == ("cpu", "fp32")
        assert len((run_dir / "dev.hyp").read_text().splitlines()) == 12
    before = {name: weights(out / "runs" / name) for name in rows}

    # Another list of variants into the same OUT (as two lists run side by side): its table has
    # the rows the other call measured too.
    assert experiment(data, out, variants="C6") == 0
    assert "1 rows: C6 skipped" in capsys.readouterr().out
    both = json.loads((out / "table.json").read_text())["rows"]
    assert [r["variant"] for r in both] == ["base", "C6"] and "2 of 2 rows done" in (out / "table.md").read_text()

    # Again: both done, skipped, nothing retrained.
    mtime = (out / "runs" / "base" / "model" / "model.safetensors").stat().st_mtime_ns
    assert experiment(data, out) == 0
    assert "2 rows: base skipped, C6 skipped" in capsys.readouterr().out
    assert (out / "runs" / "base" / "model" / "model.safetensors").stat().st_mtime_ns == mtime

    # An interrupted run (its last checkpoint at step 2, no final model): resumed, exactly.
    c6 = out / "runs" / "C6"
    for p in (c6 / "model", c6 / "checkpoints" / "step_0000004"):
        shutil.rmtree(p)
    (c6 / "row.json").unlink()
    assert experiment(data, out) == 0
    assert "2 rows: base skipped, C6 resumed" in capsys.readouterr().out
    after = weights(c6)
    assert all(torch.equal(after[k], before["C6"][k]) for k in after)

    # Another recipe in the same directory: one line, status 2, nothing touched.
    assert experiment(data, out, "--warmup", "3") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "another recipe (warmup 2, not 3)" in err
    assert (out / "runs" / "base" / "model" / "model.safetensors").stat().st_mtime_ns == mtime


def test_a_run_directory_of_another_recipe_is_refused(data, tmp_path, capsys):
    out = tmp_path / "exp"
    run_dir = out / "runs" / "base"
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(run_dir),
                "--preset",
                "base",
                "--set",
                "model.n_layers=1",
                "--set",
                "model.d_model=16",
                "--set",
                "model.d_ff=64",
                "--max-steps",
                "1",
                "--device",
                "cpu",
                "--quiet",
                "--no-tensorboard",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert experiment(data, out, variants="base") == 2
    err = capsys.readouterr().err
    assert f"{run_dir / 'config.json'}: a run of another recipe (model.d_k None, not 2" in err
    assert not (out / "experiment.json").exists() and load_config(run_dir).train.max_steps == 1


def test_dry_run_prints_the_train_commands_the_experiment_runs(data, tmp_path, capsys):
    out = tmp_path / "exp"
    assert experiment(data, out, "--dry-run", variants="base,A1,big") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# REDUCED SCALE") and len(lines) == 5 and not out.exists()
    recipe = Recipe(updates=4, max_tokens=256, warmup=2, save_every=2, scale=0.03125, depth_scale=0.1667)
    machine = Machine(device="cpu", precision="fp32", threads=1)
    meta = read_metadata(data)
    for line, variant in zip(lines[1:4], plan(["base", "A1", "big"], recipe)):
        argv = shlex.split(line)
        assert argv[:2] == ["transduce", "train"]
        args = build_parser().parse_args(argv[1:])
        config, _ = train_cli.resolve_config(args)
        want_config, want_options = train_setup(variant, recipe, meta, machine)
        assert config == want_config  # the same model and regime ...
        assert from_args(TrainOptions, args) == want_options  # ... trained the same way
    assert "--max-steps 12" in lines[3] and "--keep-last 20" in lines[3]  # big: 3x the updates, 20 averaged (6.1)
    assert experiment(data, out, "--dry-run", "--nproc", "8", variants="base") == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("torchrun --nproc_per_node=8 -m transduce train ")


def test_unknown_variant_and_missing_validation_split_are_one_line_errors(data, tmp_path, capsys):
    out = tmp_path / "exp"
    assert experiment(data, out, variants="base,Z9") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown variant 'Z9': Table 3's rows are base, A1" in err and not out.exists()
    no_valid = tmp_path / "no-valid"
    shutil.copytree(data, no_valid)
    for p in no_valid.glob("valid.*"):
        p.unlink()
    assert experiment(no_valid, out) == 2
    assert "no validation split: Table 3 reports perplexity and BLEU on the development set" in capsys.readouterr().err
    assert not out.exists()


def test_the_default_depth_keeps_table3s_depths_apart_and_twins_are_refused():
    """At --scale 0.25 a depth scale of 0.25 would give C1 (N=2) and C2 (N=4) both N=1, C3 (N=8) and
    base (N=6) both N=2: the default depth scale is at least 0.5, and twins are refused."""
    depths = {
        v.name: next(s for s in v.sets if s.startswith("model.n_layers="))
        for v in plan(["C1", "C2", "base", "C3"], Recipe(updates=100, scale=0.25))
    }
    assert depths == {
        "C1": "model.n_layers=1",
        "C2": "model.n_layers=2",
        "base": "model.n_layers=3",
        "C3": "model.n_layers=4",
    }
    assert Recipe(updates=100, scale=0.75).depth_scale == 0.75
    with pytest.raises(UsageError, match="variants C1 and C2 become the same model at --scale 0.25 --depth-scale 0.25"):
        plan(["base", "C1", "C2"], Recipe(updates=100, scale=0.25, depth_scale=0.25))
    assert len(plan(["base", "C1"], Recipe(updates=100, scale=0.25, depth_scale=0.25))) == 2  # no twins among these


def test_scaling_keeps_the_ratios_between_rows():
    assert scaled_sets("base", 0.5, 0.5) == [
        "model.n_layers=3",
        "model.d_model=256",
        "model.d_ff=1024",
        "model.d_k=32",
        "model.d_v=32",
    ]
    assert "model.d_k=256" in scaled_sets("table3-A1", 0.5, 0.5)  # h = 1, d_k = d_model: still
    assert "model.n_layers=1" in scaled_sets("table3-C1", 0.5, 0.5) and scaled_sets("base", 1, 1) == []
    steps = {v.name: v.max_steps for v in plan(["base", "big", "D3"], Recipe(updates=1000))}
    assert steps == {"base": 1000, "big": 3000, "D3": 1000}
    assert Recipe(updates=7200).save_every == 100  # 6.1's every 10 minutes of a 12-hour run


def test_slurm_jobs_run_the_train_commands_then_the_experiment_measures_them(data, tmp_path, capsys, monkeypatch):
    """--slurm submits each variant's `transduce train` command through submitit (its local
    executor here: the same job, run as a subprocess); the experiment then measures the run."""
    import submitit  # the `slurm` extra (in `test`)

    src = str(Path(__file__).resolve().parents[1] / "src")  # the job's `transduce` imports this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    out = tmp_path / "exp"
    recipe = Recipe(updates=2, max_tokens=256, warmup=2, save_every=2, scale=0.03125, depth_scale=0.1667)
    machine = Machine(device="cpu", precision="fp32", threads=1, progress=False)
    jobs = submit_slurm(data, out, ["C6"], recipe, machine, partition=None, minutes=5, cluster="local")
    assert isinstance(jobs["C6"], submitit.Job)
    jobs["C6"].result()  # waits; raises if the command failed
    assert (out / "runs" / "C6" / "model").is_dir()
    assert (
        main(
            [
                "experiment",
                "--data",
                str(data),
                "--out",
                str(out),
                "--variants",
                "C6",
                *RECIPE[:1],
                "2",
                *RECIPE[2:],
                *MACHINE,
            ]
        )
        == 0
    )
    assert "1 rows: C6 measured" in capsys.readouterr().out


def test_slurm_where_there_is_no_slurm_is_a_one_line_error_not_local_jobs(data, tmp_path, capsys, monkeypatch):
    """submitit's AutoExecutor would pick its local executor where Slurm is missing and train every
    variant here, as if submitted: --slurm asks for Slurm (sbatch on PATH) and says so otherwise."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    out = tmp_path / "exp"
    assert experiment(data, out, "--slurm", variants="C6") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--slurm: no Slurm here (sbatch is not on PATH)" in err
    assert not (out / "runs").exists()


def test_each_rows_direction_against_base_is_set_beside_the_papers():
    from transduce.experiments.plan import TABLE3
    from transduce.experiments.table import PAPER, directions, directions_markdown

    assert set(PAPER) == set(TABLE3)
    rows = [
        {"variant": "base", "dev_ppl": 10.0, "dev_bleu": 30.0},
        {"variant": "A1", "dev_ppl": 11.0, "dev_bleu": 29.0},  # worse, as the paper's A1
        {"variant": "C7", "dev_ppl": 10.1, "dev_bleu": 30.2},  # within noise: the paper's C7 is better
        {"variant": "A3", "dev_ppl": 9.0, "dev_bleu": 30.1},
    ]  # paper's A3: -0.2% PPL, same BLEU
    d = {x["variant"]: x for x in directions(rows)}
    assert set(d) == {"A1", "C7", "A3"}
    assert (d["A1"]["paper_ppl_dir"], d["A1"]["here_ppl_dir"], d["A1"]["ppl_holds"]) == ("worse", "worse", True)
    assert d["A1"]["bleu_holds"] and abs(d["A1"]["here_dbleu"] + 1.0) < 1e-9
    assert (d["C7"]["paper_ppl_dir"], d["C7"]["here_ppl_dir"], d["C7"]["ppl_holds"]) == ("better", "=", False)
    assert (d["A3"]["paper_ppl_dir"], d["A3"]["here_ppl_dir"]) == ("=", "better")
    assert d["A3"]["paper_bleu_dir"] == "=" and d["A3"]["here_bleu_dir"] == "="
    text = "\n".join(directions_markdown(rows))
    assert "holds here for 1 of 3 rows in perplexity" in text and "| A1 | 5.29 | 24.9 |" in text
    assert directions([r for r in rows if r["variant"] != "base"]) == []
