"""The training loop and `transduce train`: loss normalisation, precision, the run directory,
clear errors; and the loss (5.4) and schedule (5.3) it uses."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transduce.checkpoint import load_model
from transduce.config import Config, ModelConfig
from transduce.data.batching import ParallelDataset
from transduce.errors import UsageError
from transduce.model import Transformer
from transduce.train.loss import label_smoothed_nll
from transduce.train.schedule import learning_rate
from train_data import VOCAB, make_data
from transduce.cli import main
from transduce.train.step import autocast_for, build_optimizer, prepare_for_training, set_lr, train_step
from transduce.train.state import BatchStream
from transduce.train.trainer import TrainOptions


TINY = [
    "--preset",
    "base",
    "--set",
    "model.n_layers=1",
    "--set",
    "model.d_model=16",
    "--set",
    "model.d_ff=32",
    "--set",
    "model.n_heads=2",
    "--threads",
    "1",
    "--quiet",
    "--no-tensorboard",
]


# --- the loss and the schedule ----------------------------------------------------------------------


def test_label_smoothed_loss_matches_torch_and_skips_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0
    target[2, 1:] = 0
    loss, nll = label_smoothed_nll(logits, target, epsilon=0.1, pad_id=0)
    flat = logits.view(-1, 11), target.view(-1)
    torch.testing.assert_close(loss, F.cross_entropy(*flat, ignore_index=0, label_smoothing=0.1, reduction="sum"))
    torch.testing.assert_close(nll, F.cross_entropy(*flat, ignore_index=0, reduction="sum"))
    # bf16 logits: computed in fp32
    loss16, _ = label_smoothed_nll(logits.bfloat16(), target, epsilon=0.1)
    assert loss16.dtype == torch.float32


def test_noam_schedule_is_equation_3():
    d, w = 512, 4000
    assert learning_rate(w, d) == pytest.approx(d**-0.5 * w**-0.5)  # the peak
    assert learning_rate(w // 2, d) == pytest.approx(learning_rate(w, d) / 2)  # linear warmup
    assert learning_rate(4 * w, d) == pytest.approx(learning_rate(w, d) / 2)  # inverse square root decay
    assert max(learning_rate(s, d) for s in range(1, 3 * w)) == learning_rate(w, d)


def test_one_way_to_prepare_a_model_for_training():
    """What the trainer, `transduce.synthetic` and the bench call: dropout swapped for BitDropout
    (the same p), equation 1 through autocast_attention on the CPU in bf16 only, training mode;
    the parameters and their values untouched."""
    from transduce.fast.train import BitDropout

    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(src_vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2)).eval()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        ready = prepare_for_training(model, torch.device("cpu"), precision)
        assert ready.training and not any(isinstance(m, torch.nn.Dropout) for m in ready.modules())
        assert {m.p for m in ready.modules() if isinstance(m, BitDropout)} == {0.1}
        assert all(torch.equal(v, before[k]) for k, v in ready.state_dict().items())


def test_options_fall_back_to_the_config_in_one_place():
    """--batch-tokens and --keep-last default to config.train's max_tokens (per optimizer step,
    shared out) and average_last; the total per step is recorded in the config."""
    config = Config()
    got = TrainOptions(update_freq=2).resolve(config, world_size=4)
    assert (got.max_tokens, got.keep_last) == (25000 // 8, 5)
    assert config.train.max_tokens == 25000 // 8 * 8
    given = TrainOptions(max_tokens=100, keep_last=0)
    assert given.resolve(Config(), world_size=1) == given  # what is given is kept, 0 included
    small = Config()
    small.train.max_tokens = 4
    with pytest.raises(UsageError, match="less than one token per micro-batch"):
        TrainOptions(update_freq=8).resolve(small, world_size=1)


def test_cooldown_is_off_by_default_and_linear_to_zero():
    def factor(step, cooldown):  # the rate of step `step` of 100 over equation 3's (warmup 1: it decays alone)
        return learning_rate(step, 16, 1, cooldown=cooldown, max_steps=100) / learning_rate(step, 16, 1)

    assert factor(100, 0.0) == 1.0  # the paper's schedule
    assert factor(51, 0.2) == 1.0
    assert factor(81, 0.2) == pytest.approx(1.0)
    assert factor(91, 0.2) == pytest.approx(0.5)
    assert learning_rate(101, 16, 1, cooldown=0.2, max_steps=100) == 0.0


def test_cooldown_in_a_run_follows_the_step_budget(tmp_path):
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(data),
            "--run-dir",
            str(run),
            *TINY,
            "--batch-tokens",
            "40",
            "--max-steps",
            "8",
            "--valid-every",
            "0",
            "--log-every",
            "1",
            "--warmup",
            "2",
            "--cooldown",
            "0.5",
        ]
    )
    assert rc == 0
    lrs = [
        json.loads(line)["lr"]
        for line in (run / "logs" / "train.jsonl").read_text().splitlines()
        if json.loads(line)["type"] == "train"
    ]
    # step s + 1 uses progress s / 8: full rate up to step 5, then 3/4, 1/2, 1/4 of equation 3
    expected = [learning_rate(s, 16, 2, cooldown=0.5, max_steps=8) for s in range(1, 9)]
    assert lrs == pytest.approx(expected)
    assert expected[-1] == pytest.approx(learning_rate(8, 16, 2) / 4)
    assert expected[:5] == pytest.approx([learning_rate(s, 16, 2) for s in range(1, 6)])


def test_max_minutes_is_a_cap_that_says_when_it_binds(tmp_path, capsys):
    """The recipe is the steps; --max-minutes stops short of them only with a note, and the
    checkpoint forced there is marked off the interval (averaging leaves it out)."""
    from transduce.checkpoint import last_checkpoints

    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(data),
            "--run-dir",
            str(run),
            *TINY,
            "--batch-tokens",
            "40",
            "--max-steps",
            "100000",
            "--valid-every",
            "0",
            "--save-every-steps",
            "2",
            "--max-minutes",
            "0.004",
            "--log-every",
            "1",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "stopped training at step" in out and "of 100000: this model is not the recipe's" in out
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    capped = [r for r in records if r["type"] == "capped"]
    assert capped and capped[0]["max_steps"] == 100000
    step = capped[0]["step"]
    last = json.loads((run / "checkpoints" / f"step_{step:07d}" / "trainer_state.json").read_text())
    assert last["on_interval"] == (step % 2 == 0)
    if step % 2:
        assert all(p.name != f"step_{step:07d}" for p in last_checkpoints(run, 1))


def test_remaining_time_estimate():
    from transduce.train.trainer import _remaining

    assert _remaining(10, 110, 20.0, 10, None) == "ETA 03:20"  # 100 steps at 2 s
    assert _remaining(10, 10010, 20.0, 10, None) == "ETA 5:33:20"
    assert _remaining(10, 110, 20.0, 10, 1.0) == "ETA 01:00 (--max-minutes)"
    assert _remaining(0, 110, 0.0, 0, None) == "ETA --:--"


# --- one step: normalisation and precision -----------------------------------------------------------


def _model_and_optimizer(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    config = Config(
        model=ModelConfig(src_vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=dropout)
    )
    model = Transformer(config.model).train()
    optimizer = build_optimizer(model, config)
    set_lr(optimizer, 1e-2)
    return model, optimizer


def test_accumulated_micro_batches_equal_one_batch_of_their_union(tmp_path):
    """The loss is normalised by the target tokens of the whole step, not per micro-batch: two
    micro-batches of very different sizes give the update of one batch holding both."""
    dataset = ParallelDataset.load(make_data(tmp_path), "train")
    a, b = [0, 1, 2, 3, 4, 5, 6], [7, 8]
    # Plain SGD (lr 1: the update is the gradient). Adam with eps = 1e-9 would turn rounding noise
    # in gradients that are zero in exact arithmetic (the key bias) into full-size steps.
    m1, m2 = _model_and_optimizer()[0], _model_and_optimizer()[0]
    o1, o2 = torch.optim.SGD(m1.parameters(), lr=1.0), torch.optim.SGD(m2.parameters(), lr=1.0)
    s1 = train_step(m1, o1, [dataset.collate(a), dataset.collate(b)], label_smoothing=0.1).sums
    s2 = train_step(m2, o2, [dataset.collate(a + b)], label_smoothing=0.1).sums
    torch.testing.assert_close(s1, s2)
    for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6, msg=name)


def test_bf16_autocast_really_computes_in_bf16_and_keeps_fp32_weights(tmp_path):
    dataset = ParallelDataset.load(make_data(tmp_path), "train")
    model, optimizer = _model_and_optimizer()
    dtypes = set()
    hooks = [
        m.register_forward_hook(lambda mod, inp, out: dtypes.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    batch = dataset.collate(list(range(8)))
    with autocast_for(torch.device("cpu"), "bf16"):
        logits = model(batch["src"], batch["tgt_in"])
    assert logits.dtype == torch.bfloat16 and dtypes == {torch.bfloat16}
    for h in hooks:
        h.remove()
    sums, norm, updated = train_step(model, optimizer, [batch], label_smoothing=0.1, precision="bf16")
    assert torch.isfinite(sums).all() and float(norm) > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_batch_stream_position_continues_the_same_order(tmp_path):
    dataset = ParallelDataset.load(make_data(tmp_path), "train")
    full = BatchStream(dataset, 40, seed=1)
    seen = [full.next().tolist() for _ in range(3 * len(full))]  # three epochs
    k = len(full) + 2
    resumed = BatchStream(dataset, 40, seed=1)
    for _ in range(k):
        resumed.next()
    again = BatchStream(dataset, 40, seed=1, epoch=resumed.epoch, position=resumed.position)
    assert [again.next().tolist() for _ in range(len(seen) - k)] == seen[k:]
    assert seen[: len(full)] != seen[len(full) : 2 * len(full)]  # reshuffled each epoch
    assert sorted(i for b in seen[: len(full)] for i in b) == list(range(len(dataset)))


# --- the command line -------------------------------------------------------------------------------


def test_cli_run_dir_holds_everything_later_commands_need(tmp_path, capsys):
    data = make_data(tmp_path / "data", separate=True)
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(data),
            "--run-dir",
            str(run),
            *TINY,
            "--batch-tokens",
            "40",
            "--update-freq",
            "2",
            "--max-steps",
            "4",
            "--save-every-steps",
            "2",
            "--valid-every",
            "2",
            "--log-every",
            "2",
            "--warmup",
            "3",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "valid loss" in out and "target tokens/s" in out
    assert "step 2/4 |" in out and "| ETA " in out  # steps done of the recipe's, and the time left
    # separate vocabularies: what is still tied is said, not silently switched off
    assert "separate source and target vocabularies" in out and "tied (model.tie_output)" in out
    config = json.loads((run / "config.json").read_text())
    # separate vocabularies -> no shared embeddings; sizes from the data; flags recorded
    assert config["model"]["share_embeddings"] is False
    assert (config["model"]["src_vocab_size"], config["model"]["tgt_vocab_size"]) == (VOCAB, VOCAB + 5)
    assert config["train"]["warmup_steps"] == 3 and config["train"]["max_steps"] == 4
    assert config["train"]["max_tokens"] == 80  # per step: 40 x 2 micro-batches x 1 process
    assert json.loads((run / "data.json").read_text())["data_dir"] == str(data.absolute())
    assert (run / "spm.src.model").is_file() and (run / "spm.tgt.model").is_file()

    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("train") == 2
    train_rec = [r for r in records if r["type"] == "train"][-1]
    assert {"loss", "nll", "ppl", "lr", "grad_norm", "target_tokens_per_s"} <= train_rec.keys()
    assert train_rec["lr"] == pytest.approx(learning_rate(4, 16, 3))
    valid = [r for r in records if r["type"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4]
    assert valid[-1]["ppl"] == pytest.approx(math.exp(valid[-1]["nll"]))
    assert valid[-1]["loss"] > valid[-1]["nll"]  # the smoothed loss is not the perplexity's nll

    final, cfg = load_model(run / "model")
    ckpt, _ = load_model(run / "checkpoints" / "step_0000004")
    for (k, v), w in zip(final.state_dict().items(), ckpt.state_dict().values()):
        assert torch.equal(v, w), k
    assert cfg.model.tgt_vocab_size == VOCAB + 5

    # run again with nothing left to do, without --data (taken from RUN_DIR/data.json)
    assert main(["train", "--run-dir", str(run), "--max-steps", "4", "--quiet", "--no-tensorboard"]) == 0
    # a run already past --max-steps: said plainly, nothing trained or rewritten
    before = _files(run)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--max-steps", "3", "--quiet", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"transduce train: error: {run} is already at step 4, past --max-steps 3: nothing was trained "
        "(a larger --max-steps continues it)\n"
    )
    assert {k: v for k, v in _files(run).items() if k != ".lock"} == {k: v for k, v in before.items() if k != ".lock"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data", "/nonexistent/data"], "no such data directory"),
        (["--preset", "huge"], "unknown preset"),
        (["--set", "model.nope=3"], "bad override"),
        (["--set", "model.n_heads=many"], "bad --set model.n_heads=many: expected an integer"),
        (["--set", "model.norm_first=maybe"], "bad --set model.norm_first=maybe: expected true or false"),
        (["--set", "model.n_heads=5"], "n_heads (5) must divide d_model (512)"),
        (["--lr-scale", "-1"], "--lr-scale -1: train.lr_scale must be positive"),
        (["--label-smoothing", "1"], "--label-smoothing 1: train.label_smoothing must be in [0, 1)"),
        (["--max-steps", "0"], "--max-steps 0: train.max_steps must be at least 1"),
        (["--batch-tokens", "0"], "--batch-tokens must be at least 1, not 0"),  # was silently the preset's
        (["--cooldown", "2"], "--cooldown must be a fraction in [0, 1]"),
        (["--clip-norm", "-1"], "--clip-norm must be at least 0"),
        (["--keep-last", "-1"], "--keep-last must be at least 0"),
        (["--save-every-steps", "-5"], "--save-every-steps must be at least 0"),
        (["--valid-every", "-1"], "--valid-every must be at least 0"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--update-freq", "0"], "--update-freq must be at least 1"),
        (["--log-every", "0"], "--log-every must be at least 1"),
        (["--save-every-minutes", "-1"], "--save-every-minutes -1: train.checkpoint_minutes must be at least 0"),
        (["--set", "model.src_vocab_size=99"], "vocabulary sizes come from the data"),
        (["--precision", "fp16", "--device", "cpu"], "fp16 needs CUDA"),
        (["--batch-tokens", "5"], "max_tokens"),
        (["--data", "EMPTY"], "data.json"),
        (["--data", "BADJSON"], "badjson/data.json:2: not valid JSON (Expecting ',' delimiter, column 1)"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, extra, message):
    data = make_data(tmp_path / "data", n_train=8, n_valid=2)
    (tmp_path / "empty").mkdir()
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "data.json").write_text('{"format": 1\n"vocab": {}}')
    extra = [str(tmp_path / x.lower()) if x in ("EMPTY", "BADJSON") else x for x in extra]
    argv = [
        "train",
        "--data",
        str(data),
        "--run-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "1",
        "--quiet",
        "--no-tensorboard",
        "--threads",
        "1",
    ]
    rc = main(argv + extra)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("transduce train: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err


def test_tensorboard_is_optional(tmp_path, monkeypatch):
    import sys

    from transduce.train.state import RunLog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    log = RunLog(tmp_path / "a")
    log.write("train", 1, loss=2.0)
    log.close()
    assert log.tb is None and json.loads((tmp_path / "a" / "train.jsonl").read_text())["loss"] == 2.0


def test_tensorboard_scalars_when_installed(tmp_path):
    """tensorboard is a test dependency (pyproject's `test` extra): this test runs, never skips."""
    from transduce.train.state import RunLog

    log = RunLog(tmp_path)
    log.write("train", 5, loss=2.0, lr=1e-3, target_tokens_per_s=100.0, grad_norm=0.5)
    log.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert {"train/loss", "train/lr", "train/target_tokens_per_s", "train/grad_norm"} <= set(acc.Tags()["scalars"])
    assert acc.Scalars("train/loss")[0].step == 5


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_resume_refuses_data_of_another_vocabulary_before_writing_anything(tmp_path, capsys):
    import shutil

    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    common = ["--run-dir", str(run), "--quiet", "--no-tensorboard", "--threads", "1", "--valid-every", "0"]
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                *TINY[:-4],
                "--batch-tokens",
                "40",
                "--max-steps",
                "2",
                "--warmup",
                "3",
                *common,
            ]
        )
        == 0
    )
    others = {}
    others["model"] = shutil.copytree(data, tmp_path / "other_model")  # same sizes, another sentencepiece model
    (others["model"] / "spm.model").write_bytes(b"another sentencepiece model")
    for name, size in (("smaller", VOCAB - 4), ("larger", VOCAB + 8)):
        others[name] = shutil.copytree(data, tmp_path / f"other_{name}")
        meta = json.loads((others[name] / "data.json").read_text())
        meta["vocab"]["size"] = {"src": size, "tgt": size}
        (others[name] / "data.json").write_text(json.dumps(meta))
    others["separate"] = make_data(tmp_path / "other_separate", separate=True)
    before = _files(run)
    for name, other in others.items():
        capsys.readouterr()
        assert main(["train", "--data", str(other), "--max-steps", "3", *common]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("transduce train: error: ") and err.count("\n") == 1, err
        assert f"{other} has another vocabulary than the run being resumed ({run})" in err, err
        assert str(data.absolute()) in err  # the data the run was trained on
        assert _files(run) == before, name  # data.json, the vocabulary copies: untouched
    # the plain command again still works, and so does the same data at another path
    assert main(["train", "--max-steps", "3", *common]) == 0
    moved = shutil.copytree(data, tmp_path / "moved")
    assert main(["train", "--data", str(moved), "--max-steps", "4", *common]) == 0
    assert json.loads((run / "data.json").read_text())["data_dir"] == str(moved.absolute())


def test_a_fresh_run_replaces_stale_vocabulary_copies(tmp_path):
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    run.mkdir()
    (run / "spm.model").write_bytes(b"left by an earlier run on other data")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(run),
                *TINY,
                "--batch-tokens",
                "40",
                "--max-steps",
                "1",
                "--warmup",
                "3",
                "--valid-every",
                "0",
            ]
        )
        == 0
    )
    assert (run / "spm.model").read_bytes() == (data / "spm.model").read_bytes()


def test_on_a_terminal_the_start_line_comes_before_the_progress_bar(tmp_path, monkeypatch):
    import io
    import sys

    events = []

    class Terminal(io.StringIO):  # stdout and stderr of one terminal, in the order written
        def __init__(self, name):
            super().__init__()
            self.name = name

        def write(self, text):
            if text:
                events.append((self.name, text))
            return len(text)

        def isatty(self):
            return True

    data = make_data(tmp_path / "data")
    monkeypatch.setattr(sys, "stdout", Terminal("out"))
    monkeypatch.setattr(sys, "stderr", Terminal("err"))
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--run-dir",
                str(tmp_path / "run"),
                *TINY[:-4],
                "--threads",
                "1",
                "--no-tensorboard",
                "--batch-tokens",
                "40",
                "--max-steps",
                "2",
                "--warmup",
                "3",
                "--valid-every",
                "0",
            ]
        )
        == 0
    )
    start = next(i for i, (_, text) in enumerate(events) if text.startswith("training "))
    bar = next(i for i, (name, text) in enumerate(events) if name == "err" and "train:" in text)
    assert start < bar


def test_a_start_that_fails_on_bad_data_leaves_no_run_directory_it_created(tmp_path, capsys):
    data = make_data(tmp_path / "data")
    (data / "train.src.bin").write_bytes(b"\0" * 8)  # truncated
    argv = ["train", "--data", str(data), *TINY, "--batch-tokens", "40", "--max-steps", "1"]
    assert main([*argv, "--run-dir", str(tmp_path / "new")]) == 2
    assert "train.src.bin" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # not a directory holding only .lock
    (tmp_path / "mine").mkdir()  # one the user made is left as it was made (bar the lock file)
    assert main([*argv, "--run-dir", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()
