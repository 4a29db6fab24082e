"""`transduce translate`: line for line out, empty lines, truncation, bad UTF-8, batching,
n-best output and checkpoint averaging, on a tiny random model with a tiny sentencepiece
vocabulary trained here."""

import gzip
import io
import json
import os
import random
import shutil
import sys

import pytest
import torch

from transduce.checkpoint import save_model
from transduce.config import Config, ModelConfig
from transduce.data.vocab import Vocab, train_vocab
from transduce.cli import main
from transduce.decoding.ready import load_translation_model
from transduce.decoding.streaming import Workers
from transduce.decoding.translate import translate_lines, translate_stream

WORDS = [
    "a",
    "man",
    "woman",
    "dog",
    "runs",
    "sits",
    "on",
    "the",
    "grass",
    "red",
    "blue",
    "ball",
    "with",
    "two",
    "children",
    "play",
    "near",
    "water",
    "street",
    "looks",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory: random 2-layer model (d_model 32) + a 100-piece shared BPE vocabulary
    beside it (spm.model)."""
    root = tmp_path_factory.mktemp("translate")
    rng = random.Random(0)
    lines = [sentence(rng, rng.randint(3, 12)) for _ in range(400)]
    spm = train_vocab(root / "spm", lines, vocab_size=100, num_threads=1)
    vocab = Vocab(spm)
    torch.manual_seed(0)
    mc = ModelConfig(src_vocab_size=len(vocab), n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0)
    from transduce.model import Transformer

    model = Transformer(mc)
    d = root / "model"
    save_model(model, Config(model=mc), d)
    shutil.copy(spm, d / "spm.model")
    return d


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_translation_model(model_dir)


FAST = ["--quiet", "--beam", "2", "--max-len-offset", "4"]


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_line_count_preserved_including_empty_lines(model_dir, tmp_path):
    src = write(tmp_path / "in.txt", ["a man runs", "", "the dog sits on the grass", "   ", "blue ball", ""])
    out = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "--input", str(src), "--out", str(out), *FAST]) == 0
    got = out.read_bytes().decode("utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == 6  # six lines, each ended by "\n"
    assert got[1] == "" and got[3] == "" and got[5] == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # the temporary file is gone


def test_gzip_input_and_output(model_dir, tmp_path):
    src = tmp_path / "in.txt.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("a man runs\nthe red ball\n")
    out = tmp_path / "out.txt.gz"
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), *FAST]) == 0
    with gzip.open(out, "rt", encoding="utf-8") as f:
        assert len(f.read().split("\n")) == 3


def test_stdin_to_stdout(model_dir, monkeypatch, capsysbinary):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a man runs\n\nthe dog\n")))
    assert main(["translate", str(model_dir), *FAST]) == 0
    out = capsysbinary.readouterr().out.decode("utf-8")
    assert out.count("\n") == 3 and out.split("\n")[1] == ""


def test_overlong_line_is_truncated_with_a_warning(model_dir, tmp_path, capsys):
    rng = random.Random(1)
    src = write(tmp_path / "in.txt", ["a man", sentence(rng, 40), "the dog"])
    out = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--truncate-input", "8", *FAST]) == 0
    err = capsys.readouterr().err
    assert f"transduce translate: warning: {src}:2:" in err and "limit of 8" in err
    assert f"{src}:1:" not in err and f"{src}:3:" not in err
    assert len(out.read_text(encoding="utf-8").split("\n")) == 4


def test_learned_positions_bound_the_input(loaded):
    from transduce.decoding.streaming import input_token_limit

    assert input_token_limit(1024, 50, positions=64) == 64 - 1 - 50
    assert input_token_limit(1024, 50) == 1024  # sinusoids: only the option
    with pytest.raises(ValueError, match="lower --max-len-offset"):
        input_token_limit(1024, 63, positions=64)
    from transduce.model import Transformer

    model = Transformer(ModelConfig(src_vocab_size=100, positional="learned", max_positions=64))
    with pytest.raises(ValueError, match="the position table has 64 rows"):  # what translate_stream passes
        next(translate_stream(model, loaded.src_vocab, loaded.tgt_vocab, ["a"], max_len_offset=63))


def test_a_model_not_made_ready_translates_the_same(model_dir):
    """`translate_stream` decodes the model as it is given and sets nothing on it: one as loaded
    (its own layers) translates as one made ready (packed weights, the flat step), the scores equal
    but for float rounding (other kernels)."""
    from transduce.fast.decode import is_packed
    from transduce.decoding.ready import make_ready
    from transduce.model import Decoder

    plain, ready = load_translation_model(model_dir), load_translation_model(model_dir)
    undo = make_ready(ready.model)
    assert is_packed(ready.model) == (ready.model.decoder.embed.weight.device.type == "cpu")
    rng = random.Random(3)
    lines = [sentence(rng, rng.randint(1, 12)) for _ in range(12)]
    for greedy in (False, True):
        got = [
            list(translate_stream(m.model, m.src_vocab, m.tgt_vocab, lines, greedy=greedy, n_best=1 if greedy else 4))
            for m in (plain, ready)
        ]
        assert [[c.tokens for c in cands] for cands in got[0]] == [[c.tokens for c in cands] for cands in got[1]]
        if not greedy:
            assert [c.score for cands in got[0] for c in cands] == pytest.approx(
                [c.score for cands in got[1] for c in cands]
            )
    assert not is_packed(plain.model) and type(plain.model.decoder) is Decoder
    undo()
    assert not is_packed(ready.model) and type(ready.model.decoder) is Decoder


def test_invalid_utf8_is_a_one_line_error_and_leaves_no_output(model_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_bytes(b"a man runs\n" * 3 + b"the \xff dog\n" + b"blue ball\n")
    out = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--chunk-lines", "2", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0] == f"transduce translate: error: {src}:4: invalid UTF-8 (byte 5 of the line)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no out.txt, no temporary file


@pytest.mark.parametrize("command", ["translate", "evaluate", "prepare"])
def test_truncated_gzip_is_the_same_one_line_error_everywhere(model_dir, tmp_path, capsys, command):
    """Every command that reads text reports a truncated .gz the same way: FILE:LINE, no traceback."""
    import gzip

    from transduce import cli

    data = gzip.compress(b"a man runs on the grass .\n" * 4000)
    src = tmp_path / "broken.gz"
    src.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    argv = {
        "translate": ["translate", str(model_dir), "-i", str(src), "-o", str(out), *FAST],
        "evaluate": ["evaluate", "--hyp", str(src), "--ref", str(src), "--tgt", "de"],
        "prepare": [
            "prepare",
            "--train-src",
            str(src),
            "--train-tgt",
            str(src),
            "--valid-src",
            str(src),
            "--valid-tgt",
            str(src),
            "--out",
            str(out),
        ],
    }[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]  # (prepare also draws progress lines)
    assert len(errors) == 1 and "Traceback" not in err, err
    assert f"error: {src}:" in errors[0] and "corrupt gzip data" in errors[0]
    assert not out.exists()


def test_missing_vocabulary_is_a_one_line_error(loaded, tmp_path, capsys):
    d = tmp_path / "bare"
    save_model(loaded.model, loaded.config, d)
    assert main(["translate", str(d), *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --vocab" in err[0]


def test_batch_equals_each_line_alone(loaded):
    rng = random.Random(2)
    lines = [sentence(rng, rng.randint(1, 14)) for _ in range(12)] + [""]
    kw = dict(beam=3, alpha=0.6, max_len_offset=6)
    batched = list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, batch_size=64, **kw))
    alone = [list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, [s], **kw))[0] for s in lines]
    assert [c[0].tokens for c in batched] == [c[0].tokens for c in alone]
    assert [c[0].score for c in batched] == pytest.approx([c[0].score for c in alone], abs=1e-4)
    # Small batches (several per chunk, chunks of 5 lines) give the same again, in input order.
    small = translate_lines(
        loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, batch_size=2, batch_tokens=30, **kw
    )
    assert small == [c[0].text for c in alone]
    assert small[-1] == ""


def test_workers_give_the_same_output_in_the_same_order(loaded):
    """Two forked workers decode two batches at once: the same candidates, in input order, over
    several chunks with empty lines; greedy too; and an error in a worker reaches the caller."""
    rng = random.Random(3)
    lines = [sentence(rng, rng.randint(1, 14)) if i % 7 else "" for i in range(23)]
    for kw in (dict(beam=3, alpha=0.6, max_len_offset=6, n_best=2), dict(greedy=True, max_len_offset=6)):
        kw.update(batch_size=3, chunk_lines=10)
        one = list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, **kw))
        two = list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, workers=2, **kw))
        assert [[c.tokens for c in cs] for cs in two] == [[c.tokens for c in cs] for cs in one]
        assert [[c.text for c in cs] for cs in two] == [[c.text for c in cs] for cs in one]
        if not kw.get("greedy"):
            assert [c[0].score for c in two] == pytest.approx([c[0].score for c in one], abs=1e-5)
    assert loaded.model.training is False
    with pytest.raises(ValueError, match="workers"):
        list(translate_stream(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, workers=0))


def _pid_of_search(sources):
    return [[(os.getpid(), len(s))] for s in sources]


def test_workers_leave_fewer_batches_than_workers_to_this_process():
    """A chunk of fewer batches than workers is decoded here, with every thread (a worker would
    idle and the other decode on its share of the threads); enough batches go to the workers."""
    pool = Workers(_pid_of_search, 2, threads=2)
    try:
        one = list(pool.map([[[5, 6, 3]]]))
        assert one == [[[(os.getpid(), 3)]]]
        many = list(pool.map([[[5] * n] for n in range(1, 9)]))
        assert [r[0][0][1] for r in many] == list(range(1, 9))  # in order
        assert {r[0][0][0] for r in many} - {os.getpid()}  # decoded by the workers
        assert os.getpid() not in {r[0][0][0] for r in many}
    finally:
        pool.close()


def test_worker_threads_share_each_batch():
    """Worker threads (a large model's) decode each batch as n parts at once, one per thread, so
    that one batch's cache and logits are in flight whatever n; the candidates come back per batch,
    in order, as one search of the whole batch would give them."""
    import threading

    calls = []
    lock = threading.Lock()

    def search(sources):
        with lock:
            calls.append((threading.current_thread().name, len(sources)))
        return [[(s[0], len(s))] for s in sources]

    pool = Workers(search, 2, threads=2, threads_not_processes=True)
    try:
        batches = [[[i, j] for j in range(n)] for i, n in enumerate([5, 4, 1, 3])]
        out = list(pool.map(batches))
        one = list(pool.map([[[7, 0], [7, 1], [7, 2]]]))  # one batch: shared too
        calls_one, calls[:] = calls[7:], calls[:7]
        alone = list(pool.map([[[8, 0]]]))  # one sentence: this thread, with every thread
    finally:
        pool.close()
    assert out == [[[(i, 2)] for _ in b] for i, b in enumerate(batches)]  # per batch, in order
    assert sorted(n for _, n in calls[:7]) == [1, 1, 2, 2, 2, 2, 3]  # 5 -> 3 + 2, 4 -> 2 + 2, 1 -> 1, 3 -> 2 + 1
    assert all(name.startswith("transduce-worker") for name, _ in calls[:7])
    assert one == [[[(7, 2)]] * 3] and sorted(n for _, n in calls_one) == [1, 2]
    assert alone == [[[(8, 2)]]] and calls[-1] == (threading.current_thread().name, 1)


def test_cli_workers_write_the_same_file(model_dir, tmp_path, capsys):
    rng = random.Random(4)
    src = write(tmp_path / "in.txt", [sentence(rng, rng.randint(1, 10)) for _ in range(9)] + [""])
    outs = []
    for w in ("1", "2"):
        out = tmp_path / f"out{w}.txt"
        assert (
            main(
                [
                    "translate",
                    str(model_dir),
                    "--input",
                    str(src),
                    "--out",
                    str(out),
                    "--batch-size",
                    "2",
                    "--workers",
                    w,
                    *FAST,
                ]
            )
            == 0
        )
        outs.append(out.read_text(encoding="utf-8"))
    assert outs[0] == outs[1] and outs[0].count("\n") == 10
    # auto (the default) on two threads and a small model: two workers, said so, the same file.
    out = tmp_path / "auto.txt"
    assert (
        main(
            [
                "translate",
                str(model_dir),
                "--input",
                str(src),
                "--out",
                str(out),
                "--batch-size",
                "2",
                "--threads",
                "2",
                *[f for f in FAST if f != "--quiet"],
            ]
        )
        == 0
    )
    assert "workers: 2 x 1 thread(s) (auto: CPU, d_model 32 <= 512: one worker per thread)" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == outs[0]
    with pytest.raises(SystemExit) as stop:
        main(["translate", str(model_dir), "--workers", "none", *FAST])
    assert stop.value.code == 2
    assert "--workers: expected auto or a positive number" in capsys.readouterr().err


def test_greedy_and_bf16_run(loaded):
    lines = ["a man runs", "", "the dog sits"]
    assert (
        len(translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, greedy=True, max_len_offset=4))
        == 3
    )
    assert (
        len(
            translate_lines(
                loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, bf16=True, beam=2, max_len_offset=4
            )
        )
        == 3
    )
    assert loaded.model.training is False


def test_cli_precision_auto_says_what_it_chose_and_bf16_warns_where_emulated(model_dir, tmp_path, monkeypatch, capsys):
    import transduce.precision as precision
    from transduce.precision import Capability

    src = write(tmp_path / "in.txt", ["a man runs", "blue ball"])
    monkeypatch.setattr(
        precision, "read_capability", lambda device: Capability("cpu", "AMD EPYC (Zen 3)", frozenset(), "AVX2 only")
    )
    assert (
        main(["translate", str(model_dir), "-i", str(src), "-o", str(tmp_path / "a.txt"), *FAST[1:]]) == 0
    )  # not --quiet
    err = capsys.readouterr().err
    assert "precision: fp32 (auto: AMD EPYC (Zen 3): AVX2 only" in err and "warning" not in err
    assert (
        main(
            [
                "translate",
                str(model_dir),
                "-i",
                str(src),
                "-o",
                str(tmp_path / "b.txt"),
                "--precision",
                "bf16",
                *FAST[1:],
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert (
        "precision: bf16 (as asked" in err
        and "warning: bf16 is emulated on this CPU" in err
        and "slower than fp32" in err
    )
    assert (tmp_path / "b.txt").read_text().count("\n") == 2


def test_cli_bf16_casts_the_weights_and_keeps_line_count(model_dir, tmp_path, monkeypatch):
    """--bf16 decodes with the weights in bf16 (no autocast), line for line; scores stay fp32."""
    from transduce.decoding import translate

    seen = {}
    real = translate.translate_stream

    def spy(model, *args, **kwargs):
        seen["dtype"] = next(model.parameters()).dtype
        return real(model, *args, **kwargs)

    monkeypatch.setattr(translate, "translate_stream", spy)
    src = write(tmp_path / "in.txt", ["a man runs", "", "the dog sits on the grass"])
    out = tmp_path / "out.txt"
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--bf16", "--n-best", "2", *FAST]) == 0
    assert seen["dtype"] == torch.bfloat16
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert {int(r[0]) for r in rows} == {1, 2, 3} and all(float(r[3]) <= 0 for r in rows)


def test_n_best_format(model_dir, tmp_path):
    src = write(tmp_path / "in.txt", ["a man runs", "", "the dog sits on the grass"])
    out = tmp_path / "out.tsv"
    assert (
        main(
            [
                "translate",
                str(model_dir),
                "-i",
                str(src),
                "-o",
                str(out),
                "--quiet",
                "--beam",
                "3",
                "--n-best",
                "3",
                "--max-len-offset",
                "4",
            ]
        )
        == 0
    )
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(len(r) == 5 for r in rows)
    by_line: dict[int, list] = {}
    for line_no, rank, score, logprob, text in rows:
        by_line.setdefault(int(line_no), []).append((int(rank), float(score), float(logprob), text))
    assert sorted(by_line) == [1, 2, 3]
    assert by_line[2] == [(1, 0.0, 0.0, "")]  # the empty line: one empty hypothesis
    for n in (1, 3):
        hyps = by_line[n]
        assert [h[0] for h in hyps] == list(range(1, len(hyps) + 1)) and 1 <= len(hyps) <= 3
        scores = [h[1] for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert all(h[2] <= 0 for h in hyps)


def test_n_best_larger_than_beam_is_an_error(model_dir, capsys):
    assert main(["translate", str(model_dir), "--beam", "2", "--n-best", "3"]) == 2
    assert "--n-best must be between 1 and --beam" in capsys.readouterr().err


def _run_dir_with_checkpoints(tmp_path, loaded, model_dir):
    """A run directory with two checkpoints holding the same weights."""
    from transduce.checkpoint import STATE, TrainingState, checkpoint_name

    run = tmp_path / "run"
    for step in (1, 2):
        d = save_model(loaded.model, loaded.config, run / "checkpoints" / checkpoint_name(step))
        (d / STATE).write_text(TrainingState(step=step).to_json(), encoding="utf-8")
    shutil.copy(model_dir / "spm.model", run / "spm.model")
    return run


def test_average_of_two_identical_checkpoints_equals_one(loaded, model_dir, tmp_path):
    run = _run_dir_with_checkpoints(tmp_path, loaded, model_dir)
    avg = load_translation_model(run, average=2)
    one = load_translation_model(run, checkpoint="1")
    assert "average of the last 2 checkpoints" in avg.description
    assert one.description.endswith("step_0000001")
    for (name, a), (_, b) in zip(avg.model.state_dict().items(), one.model.state_dict().items()):
        assert torch.equal(a, b), name
    src = write(tmp_path / "in.txt", ["a man runs", "the dog sits on the grass", "blue ball"])
    out_avg, out_one = tmp_path / "avg.txt", tmp_path / "one.txt"
    assert (
        main(
            ["translate", str(run), "-i", str(src), "-o", str(out_avg), "--average", "2", *FAST, "--precision", "fp32"]
        )
        == 0
    )
    assert (
        main(
            [
                "translate",
                str(run),
                "-i",
                str(src),
                "-o",
                str(out_one),
                "--checkpoint",
                "step_0000001",
                *FAST,
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    assert out_avg.read_text(encoding="utf-8") == out_one.read_text(encoding="utf-8")


def test_run_dir_defaults_to_the_average_of_its_last_checkpoints_and_rejects_bad_choices(
    loaded, model_dir, tmp_path, capsys
):
    """6.1: the paper's Table 2 results are averaged, so a run directory gives the average of its
    last train.average_last checkpoints (all it has, if fewer); one checkpoint is a choice."""
    from transduce.checkpoint import STATE, TrainingState, checkpoint_name

    run = _run_dir_with_checkpoints(tmp_path, loaded, model_dir)
    assert loaded.config.train.average_last == 5
    assert load_translation_model(run).description.startswith(
        "average of the last 2 checkpoints (step_0000001 .. step_0000002)"
    )
    assert load_translation_model(run, checkpoint="latest").description.endswith("step_0000002")
    # A final checkpoint forced off the interval stays out of "the last K" (evenly spaced, as in 6.1).
    d = save_model(loaded.model, loaded.config, run / "checkpoints" / checkpoint_name(3))
    (d / STATE).write_text(TrainingState(step=3, on_interval=False).to_json(), encoding="utf-8")
    assert "(step_0000001 .. step_0000002)" in load_translation_model(run).description
    assert load_translation_model(run, checkpoint="latest").description.endswith("step_0000003")
    assert main(["translate", str(run), "--average", "3", *FAST]) == 2
    assert "asked for the last 3 checkpoints" in capsys.readouterr().err
    assert main(["translate", str(run), "--average", "2", "--checkpoint", "latest", *FAST]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["translate", str(run), "--checkpoint", "step_0000009", *FAST]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_run_dir_vocabulary_from_data_json(loaded, model_dir, tmp_path):
    run = tmp_path / "run"
    save_model(loaded.model, loaded.config, run / "model")
    shutil.copy(model_dir / "spm.model", run / "spm.model")
    (run / "data.json").write_text(json.dumps({"vocab": {"files": {"src": "spm.model", "tgt": "spm.model"}}}))
    got = load_translation_model(run)
    assert got.description == str(run / "model") and len(got.src_vocab) == len(loaded.src_vocab)


def test_average_is_the_elementwise_mean(loaded, model_dir, tmp_path):
    from transduce.model import Transformer
    from transduce.checkpoint import STATE, TrainingState, checkpoint_name

    run = _run_dir_with_checkpoints(tmp_path, loaded, model_dir)
    shifted = Transformer(loaded.config.model)
    shifted.load_state_dict(loaded.model.state_dict())
    with torch.no_grad():
        for p in shifted.parameters():
            p.add_(1.0)
    d = save_model(shifted, loaded.config, run / "checkpoints" / checkpoint_name(3))
    (d / STATE).write_text(TrainingState(step=3).to_json(), encoding="utf-8")
    avg = load_translation_model(run, average=2)  # step 2 (= loaded) and step 3 (= loaded + 1)
    assert avg.model.decoder.embed.weight is avg.model.encoder.embed.weight  # still tied
    for name, p in avg.model.state_dict().items():
        if p.is_floating_point() and not name.endswith("table"):
            assert torch.allclose(p, loaded.model.state_dict()[name] + 0.5, atol=1e-6), name


# --- the output file: as the shell's `>` writes it ---------------------------------------------------


def _read_fifo_in_background(fifo):
    """A reader of `fifo` in a thread (opening a FIFO to write waits for one): its bytes, once
    `done()` is called."""
    import threading

    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    t.start()

    def done():
        if t.is_alive():  # the writer never came: let the reader go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        return got[0] if got else None

    return done


def test_output_follows_a_symlink_and_writes_a_fifo_in_place(model_dir, tmp_path):
    src = write(tmp_path / "in.txt", ["a man runs", "", "the dog"])
    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to("real.txt")
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(tmp_path / "link.txt"), *FAST]) == 0
    assert (tmp_path / "link.txt").is_symlink() and os.readlink(tmp_path / "link.txt") == "real.txt"  # still a link
    assert (tmp_path / "real.txt").read_text(encoding="utf-8").count("\n") == 3  # its target written
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = _read_fifo_in_background(fifo)
    assert main(["translate", str(model_dir), "-i", str(src), "-o", str(fifo), *FAST]) == 0
    assert done().count(b"\n") == 3 and fifo.is_fifo()  # streamed through, not replaced by a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "in.txt", "link.txt", "real.txt"]  # no temporary file


@pytest.mark.parametrize(
    "output, message",
    [
        ("adir", "adir: Is a directory"),
        ("nodir/out.txt", "nodir/out.txt: No such file or directory"),
        ("in.txt/out.txt", "in.txt/out.txt: Not a directory"),
        ("ro/out.txt", "ro/out.txt: Permission denied"),
    ],
)
def test_output_that_cannot_be_written_is_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch, output, message
):
    """One line naming the user's path (never a temporary name), before anything loads (MODEL
    does not even exist here)."""
    from transduce.checkpoint import files

    write(tmp_path / "in.txt", ["a man runs"])
    (tmp_path / "adir").mkdir()
    (tmp_path / "ro").mkdir()
    access = os.access  # as root every directory can be written to: say "ro" cannot
    monkeypatch.setattr(files.os, "access", lambda p, mode: access(p, mode) and not str(p).endswith("/ro"))
    monkeypatch.chdir(tmp_path)
    assert main(["translate", "no-such-model", "-i", "in.txt", "-o", output, *FAST]) == 2
    assert capsys.readouterr().err.splitlines() == [f"transduce translate: error: {message}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "in.txt", "ro"] and not list(
        (tmp_path / "ro").iterdir()
    )


def test_sigterm_discards_the_temporary_file_and_leaves_the_output_as_it_was(model_dir, tmp_path):
    import signal
    import subprocess
    import time

    out = tmp_path / "out.txt"
    out.write_text("before\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "transduce", "translate", str(model_dir), "-o", str(out), *FAST, "--threads", "1"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    p.stdin.write(b"a man runs\n" * 5)  # and the input stays open: it waits for more
    p.stdin.flush()
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.txt.tmp-*")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert list(tmp_path.glob(".out.txt.tmp-*")), p.stderr.read().decode()  # it is writing
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 143
    assert "transduce translate: terminated" in p.stderr.read().decode()
    p.stdin.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"] and out.read_text() == "before\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--threads", "-1"], "--threads must be at least 1, not -1"),
        (["--threads", "0"], "--threads must be at least 1, not 0"),
        (["--length-penalty", "gnmt:nan"], "--length-penalty gnmt:nan: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:inf"], "--length-penalty gnmt:inf: alpha must be a finite number >= 0"),
        (["--length-penalty", "gnmt:-1"], "--length-penalty gnmt:-1: alpha must be a finite number >= 0"),
        (
            ["--engine", "ct2", "--precision", "auto-int8"],
            "--precision auto-int8 does not apply to --engine ct2: choose",
        ),
        (
            ["--engine", "ct2", "--int8", "--ct2-compute-type", "float32"],
            "--precision int8 is --ct2-compute-type int8, not float32: give one of them",
        ),
        (["--ct2-compute-type", "int8"], "--ct2-compute-type applies to --engine ct2 only"),
        (["--length-penalty", "ct2:1"], "--length-penalty ct2: --engine torch takes gnmt, hf, none"),
    ],
)
def test_bad_flags_are_one_line_errors_before_the_model_loads(tmp_path, capsys, flags, message):
    assert main(["translate", str(tmp_path / "no-such-model"), *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"transduce translate: error: {message}"), err


def test_precision_with_engine_ct2_is_its_compute_type():
    from transduce.cli import build_parser
    from transduce.cli.translate import check_args

    for flags, compute_type in [
        ([], None),
        (["--int8"], "int8"),
        (["--precision", "fp32"], "float32"),
        (["--bf16", "--ct2-compute-type", "bfloat16"], "bfloat16"),
        (["--ct2-compute-type", "int8_float32"], "int8_float32"),
    ]:
        args = build_parser().parse_args(["translate", "m", "--engine", "ct2", *flags])
        check_args(args)
        assert args.ct2_compute_type == compute_type, flags


def test_auto_workers_keep_one_process_where_a_large_models_products_scale_over_the_threads():
    # at OPUS-MT's sizes fp32's and FBGEMM's int8 products use all the threads well, oneDNN's int8 ones less (docs/speed.md)
    from transduce.config import ModelConfig
    from transduce.decoding.streaming import choose_workers, one_process_reason

    large = ModelConfig(src_vocab_size=58_101, d_model=512, d_ff=2048, n_heads=8, n_layers=6)
    small = ModelConfig(src_vocab_size=8_000, d_model=256, d_ff=1024, n_heads=4, n_layers=3)
    cpu = torch.device("cpu")
    assert one_process_reason(large, "fp32", None) == "fp32 at this size"
    assert one_process_reason(large, "int8", "fbgemm") == "int8 through FBGEMM at this size"
    assert one_process_reason(large, "int8", "onednn") == one_process_reason(large, "bf16", None) == ""
    assert one_process_reason(small, "fp32", None) == one_process_reason(small, "int8", "fbgemm") == ""
    reason = one_process_reason(large, "fp32", None)
    assert choose_workers("auto", cpu, 2, 512, reason) == (
        1,
        "auto: fp32 at this size: one process, its products on all 2 threads",
    )
    assert choose_workers(2, cpu, 2, 512, reason) == (2, "as asked")
    assert choose_workers("auto", cpu, 2, 512, "")[0] == 2
