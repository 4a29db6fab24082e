"""Fine-tuning (transduce.finetune): `prepare --vocab MODEL` encodes with MODEL's vocabulary (the
same ids), `train --init MODEL` starts from MODEL's weights (its loss on the first batch is the
model's) with a fresh schedule, and refuses data of another vocabulary or another architecture
in one line."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tiny_models import SRC_WORDS, TGT_WORDS, make_model, sentences
from transduce.checkpoint import load_model
from transduce.cli import build_parser, main
from transduce.data.batching import ParallelDataset, load_vocabs
from transduce.data.vocab import EOS, Vocab
from transduce.cli.train import resolve_config
from transduce.defaults import FINETUNE_LR, FINETUNE_WARMUP
from transduce.train.options import lr_scale_for_peak
from transduce.train.schedule import learning_rate
from transduce.train.step import evaluate


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("model"))  # a model directory, spm.model beside it


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("text")
    for split, n, seed in (("train", 24, 10), ("valid", 6, 20)):
        (d / f"{split}.en").write_text("\n".join(sentences(SRC_WORDS, n, seed)) + "\n")
        (d / f"{split}.de").write_text("\n".join(sentences(TGT_WORDS, n, seed + 1)) + "\n")
    return d


def files(texts: Path) -> list[str]:
    return [
        "--train-src",
        str(texts / "train.en"),
        "--train-tgt",
        str(texts / "train.de"),
        "--valid-src",
        str(texts / "valid.en"),
        "--valid-tgt",
        str(texts / "valid.de"),
        "--max-ratio",
        "100",
        "--quiet",
    ]


@pytest.fixture(scope="module")
def data(model, texts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "data"
    assert main(["prepare", *files(texts), "--vocab", str(model), "-o", str(out)]) == 0
    return out


def test_prepare_with_a_models_vocabulary_gives_its_ids(model, texts, data):
    meta = json.loads((data / "data.json").read_text())
    assert meta["vocab"]["from_model"] == str(model.absolute())
    assert meta["vocab"]["sha256"]["src"] == hashlib.sha256((model / "spm.model").read_bytes()).hexdigest()
    assert (data / "spm.model").read_bytes() == (model / "spm.model").read_bytes()  # no vocabulary learned: the model's
    theirs = Vocab(model / "spm.model")
    src, tgt = load_vocabs(data)
    assert len(src) == len(tgt) == len(theirs) == load_model(model)[1].model.src_vocab_size
    for split in ("train", "valid"):
        pairs = ParallelDataset.load(data, split)
        for i, (s, t) in enumerate(
            zip((texts / f"{split}.en").read_text().splitlines(), (texts / f"{split}.de").read_text().splitlines())
        ):
            assert pairs[i][0].tolist() == theirs.encode(s) + [EOS]
            assert pairs[i][1].tolist() == theirs.encode(t) + [EOS]


def test_prepare_with_separate_vocabularies_and_a_run_directory(model, texts, tmp_path):
    separate = make_model(tmp_path / "separate", shared=False)
    out = tmp_path / "data"
    assert main(["prepare", *files(texts), "--vocab", str(separate), "-o", str(out)]) == 0
    src, tgt = load_vocabs(out)
    assert (len(src), len(tgt)) == (100, 90)
    line = (texts / "valid.de").read_text().splitlines()[0]
    assert ParallelDataset.load(out, "valid")[0][1].tolist() == Vocab(separate / "spm.tgt.model").encode(line) + [EOS]
    assert (
        main(["prepare", *files(texts), "--vocab", str(separate), "--vocab-size", "50", "-o", str(tmp_path / "x")]) == 2
    )


TRAIN = [
    "--max-steps",
    "3",
    "--warmup",
    "2",
    "--batch-tokens",
    "4000",
    "--valid-every",
    "0",
    "--log-every",
    "1",
    "--save-every-minutes",
    "0",
    "--threads",
    "1",
    "--quiet",
    "--no-tensorboard",
    "--precision",
    "fp32",
]


def test_train_init_starts_at_the_models_weights_and_trains(model, data, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--run-dir", str(run), "--init", str(model), *TRAIN]) == 0
    assert f"starting from the weights of {model}" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "logs" / "train.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["type"] == "train")
    initial, config = load_model(model)
    assert config.model.dropout == 0.0  # the loss of step 1 is the model's, untouched by dropout
    train_set = ParallelDataset.load(data, "train")
    assert len(train_set.batches(4000, seed=1)) == 1  # the first step's batch is the whole split
    expected = evaluate(initial, train_set, max_tokens=4000, label_smoothing=config.train.label_smoothing)
    assert first["step"] == 1 and first["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    d_model = config.model.d_model  # a fresh schedule: --warmup 2, --init's default peak (transduce.defaults)
    assert first["lr"] == pytest.approx(learning_rate(1, d_model, 2, lr_scale_for_peak(FINETUNE_LR, d_model, 2)))
    tuned, tuned_config = load_model(run / "model")
    assert tuned_config.model == config.model
    assert not torch.equal(
        tuned.encoder.layers[0].feed_forward.w_1.weight, initial.encoder.layers[0].feed_forward.w_1.weight
    )
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert losses[-1] < losses[0]
    # run again, longer: it resumes its own checkpoints, not MODEL's weights
    assert (
        main(["train", "--data", str(data), "--run-dir", str(run), "--init", str(model), *TRAIN, "--max-steps", "4"])
        == 0
    )
    assert "resuming" in capsys.readouterr().out
    # a run directory is a MODEL too: its data is the same vocabulary
    assert main(["train", "--data", str(data), "--run-dir", str(tmp_path / "again"), "--init", str(run), *TRAIN]) == 0


def init_schedule(model, data, tmp_path, *flags) -> tuple[int, float]:
    args = build_parser(only="train").parse_args(
        ["train", "--data", str(data), "--run-dir", str(tmp_path / "r"), "--init", str(model), *flags]
    )
    config = resolve_config(args)[0]
    t, d_model = config.train, config.model.d_model
    return t.warmup_steps, learning_rate(t.warmup_steps, d_model, t.warmup_steps, t.lr_scale)


def test_init_has_a_trained_models_schedule_unless_the_flags_give_one(model, data, tmp_path, capsys):
    # the defaults chosen on the WMT14 sample's validation split (docs/training.md, "Fine-tuning")
    assert init_schedule(model, data, tmp_path) == (FINETUNE_WARMUP, pytest.approx(FINETUNE_LR))
    assert "--init's default rate" in capsys.readouterr().out
    assert init_schedule(model, data, tmp_path, "--lr", "2e-5", "--warmup", "7") == (7, pytest.approx(2e-5))
    warmup, peak = init_schedule(model, data, tmp_path, "--lr-scale", "1")  # equation 3's own rate, as asked
    d_model = load_model(model)[1].model.d_model
    assert warmup == FINETUNE_WARMUP and peak == pytest.approx(learning_rate(warmup, d_model, warmup, 1.0))


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("transduce train: error: "), err
    return err


def test_data_of_another_vocabulary_is_refused_in_one_line(model, texts, tmp_path, capsys):
    for size in ("100", "90"):  # the same size (another model), another size
        other = tmp_path / f"own{size}"
        assert main(["prepare", *files(texts), "--vocab-size", size, "-o", str(other)]) == 0
        capsys.readouterr()
        run = tmp_path / f"run{size}"
        assert main(["train", "--data", str(other), "--run-dir", str(run), "--init", str(model), *TRAIN]) == 2
        err = one_error(capsys)
        assert f"{other} is not tokenized with the vocabulary of --init {model}" in err
        assert ("SHA-256" if size == "100" else "source size 90 (the model's 100)") in err, err
        assert f"--vocab {model}" in err and not run.exists()


def test_a_preset_or_set_that_changes_the_architecture_is_refused(model, data, tmp_path, capsys):
    run = tmp_path / "run"
    for extra, named in (
        (["--set", "model.n_layers=1"], "model.n_layers 1 (the model's 2)"),
        (["--preset", "multi30k"], "model.d_model 256 (the model's 32)"),
    ):
        assert main(["train", "--data", str(data), "--run-dir", str(run), "--init", str(model), *TRAIN, *extra]) == 2
        err = one_error(capsys)
        assert named in err and "--init" in err, err
    assert not run.exists()
