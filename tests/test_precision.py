"""`--precision auto` and `auto-int8`: the table's row for each class of device, the same choice
on every run, the flags oneDNN is held below, and the warning for bf16 where the CPU only
emulates it (`transduce.precision`)."""

import json

import pytest

import transduce.precision as precision
from transduce import cpu
from transduce.cpu import cpu_flags
from transduce.fast.int8 import can_int8
from transduce.precision import Capability, choose_decoding_precision, choose_precision, cpu_row, read_capability
from train_data import make_data

AMX = Capability(
    "cpu",
    "Intel Xeon (Sapphire Rapids)",
    frozenset({"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni"}),
    "amx_bf16, amx_int8, avx512_bf16, avx512_vnni",
)
ZEN4 = Capability("cpu", "AMD EPYC (Zen 4)", frozenset({"avx512_bf16", "avx512_vnni"}), "avx512_bf16, avx512_vnni")
ZEN3 = Capability("cpu", "AMD EPYC (Zen 3)", frozenset(), "AVX2 only")
ALDER = Capability("cpu", "Intel Core (Alder Lake)", frozenset({"avx_vnni"}), "avx_vnni")
H100 = Capability("cuda", "NVIDIA H100", frozenset({"bf16"}), "compute capability 9.0")
T4 = Capability("cuda", "Tesla T4", frozenset(), "compute capability 7.5")


@pytest.mark.parametrize(
    "cap, auto, auto_int8, decoder",
    [
        (AMX, "bf16", "int8", False),  # AMX: bf16 beats int8 at the decoder's sizes; the projection alone in int8
        (ZEN4, "bf16", "int8", True),
        (ZEN3, "fp32", "fp32", True),  # bf16 emulated; int8 no faster than fp32 without VNNI
        (ALDER, "fp32", "fp32", True),  # no row measured for VNNI without bf16: fp32, exact
    ],
    ids=["amx", "zen4", "avx2", "avx_vnni"],
)
def test_the_table_chooses_by_what_the_cpu_has(cap, auto, auto_int8, decoder):
    c = choose_precision("auto", "cpu", capability=cap)
    assert c.precision == auto and c.warning is None and c.reason.startswith(f"auto: {cap.name}: {cap.detail}: ")
    assert choose_decoding_precision("auto", "cpu", capability=cap) == c
    d = choose_decoding_precision("auto-int8", "cpu", capability=cap)
    assert d.precision == (auto_int8 if can_int8() or auto_int8 != "int8" else auto)
    assert d.reason.startswith(f"auto-int8: {cap.name}: ")
    if d.precision == "int8":
        assert d.int8_decoder is decoder and d.base == "bf16"
    assert cpu_row(cap).int8_decoder is decoder


def test_cuda_follows_the_gpus_bf16_support_and_never_picks_fp16():
    assert choose_precision("auto", "cuda", capability=H100).precision == "bf16"
    assert choose_precision("auto", "cuda", capability=T4).precision == "fp32"
    assert choose_decoding_precision("auto-int8", "cuda", capability=H100).precision == "bf16"  # int8: CPU only
    with pytest.raises(ValueError, match="CPU only"):
        choose_decoding_precision("int8", "cuda", capability=H100)


def test_explicit_bf16_on_an_emulating_cpu_warns():
    c = choose_precision("bf16", "cpu", capability=ZEN3)
    assert c.precision == "bf16"
    assert "emulated" in c.warning and "slower than fp32" in c.warning and "auto would use fp32" in c.warning
    assert choose_precision("bf16", "cpu", capability=ZEN4).warning is None


def test_explicit_choices_are_obeyed_and_unknown_ones_rejected():
    assert choose_precision("fp32", capability=AMX).precision == "fp32"
    assert choose_precision("fp16", capability=AMX).precision == "fp16"
    assert choose_decoding_precision("fp32", capability=AMX) == choose_precision("fp32")
    with pytest.raises(ValueError, match="unknown precision"):
        choose_precision("int4", capability=AMX)
    with pytest.raises(ValueError, match="unknown decoding precision"):
        choose_decoding_precision("fp16", capability=AMX)


@pytest.mark.skipif(not can_int8(), reason="no oneDNN int8 kernels here")
def test_explicit_int8_follows_the_row():
    amx, zen3 = choose_decoding_precision("int8", capability=AMX), choose_decoding_precision("int8", capability=ZEN3)
    assert (amx.int8_decoder, amx.base, zen3.int8_decoder, zen3.base) == (False, "bf16", True, "fp32")
    assert "the output projection in int8, the other linear layers in bf16" in amx.reason
    assert "every linear layer in int8 (the encoder's, the decoder's, the output projection)" in zen3.reason


def test_this_machine_gets_the_same_choice_every_time():
    cap = read_capability("cpu")
    assert cap.device == "cpu" and cap.name and cap.detail and cap.features <= set(cpu.CPU_FLAGS)
    for requested in ("auto", "auto-int8"):
        first = choose_decoding_precision(requested)
        assert all(choose_decoding_precision(requested) == first for _ in range(3))
    assert choose_precision("auto").precision == cpu_row(cap).auto


def test_cpu_flags_are_those_onednn_is_left(monkeypatch):
    """ONEDNN_MAX_CPU_ISA holds oneDNN below the CPU (e.g. AVX2, to imitate a CPU without bf16):
    the table then reads what oneDNN may use (`transduce.cpu`)."""
    monkeypatch.setattr(
        cpu, "cpuinfo", lambda: {"flags": "fpu avx2 avx512_bf16 avx512_vnni amx_bf16 amx_int8 amx_tile"}
    )
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    for held, expected in (
        ("", {"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni"}),
        ("AVX512_CORE_AMX", {"amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni"}),
        ("avx2", set()),
        ("AVX512_CORE_VNNI", {"avx512_vnni"}),
        ("AVX512_CORE_BF16", {"avx512_bf16", "avx512_vnni"}),
    ):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
        assert cpu_flags() == expected, held
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    cap = read_capability("cpu")
    assert not cap.native_bf16 and "ONEDNN_MAX_CPU_ISA=AVX2" in cap.detail
    assert choose_precision("auto", capability=cap).precision == "fp32"


def test_amx_products_and_vnni_follow_the_cpu_and_onednns_isa_limit(monkeypatch):
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(cpu, "cpuinfo", lambda: {"flags": "avx2 avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8"})
    for held, amx, vnni in (
        ("", True, True),
        ("AVX512_CORE_AMX", True, True),
        ("all", True, True),
        ("AVX2", False, False),
        ("AVX512_CORE_BF16", False, True),
        ("AVX10_1_512", False, True),
        ("AVX512_CORE_FP16", False, True),
    ):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
        assert (cpu.amx_products(), cpu.has_vnni()) == (amx, vnni), held
    monkeypatch.setattr(cpu, "cpuinfo", lambda: {"flags": "avx2 fma"})  # an AVX2-only CPU (Zen 3)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert (cpu.amx_products(), cpu.has_vnni()) == (False, False)


def test_train_with_bf16_on_an_emulating_cpu_warns_and_auto_trains_fp32(tmp_path, monkeypatch, capsys):
    """The trainer says what it chose and why; `--precision bf16` where bf16 is emulated warns."""
    from transduce.cli import main

    monkeypatch.setattr(precision, "read_capability", lambda device: ZEN3)
    data = make_data(tmp_path / "data")
    common = [
        "--data",
        str(data),
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
        "--batch-tokens",
        "64",
        "--max-steps",
        "2",
        "--valid-every",
        "0",
        "--save-every-minutes",
        "0",
    ]
    assert main(["train", "--run-dir", str(tmp_path / "bf16"), "--precision", "bf16", *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (as asked; AMD EPYC (Zen 3)" in out
    assert "warning: bf16 is emulated on this CPU" in out and "slower than fp32" in out
    assert main(["train", "--run-dir", str(tmp_path / "auto"), *common]) == 0  # auto is the default
    out = capsys.readouterr().out
    assert "precision: fp32 (auto: AMD EPYC (Zen 3): AVX2 only: no bf16 instructions" in out and "warning" not in out
    start = json.loads((tmp_path / "auto" / "logs" / "train.jsonl").read_text().splitlines()[0])
    assert start["precision"] == "fp32" and start["options"]["precision"] == "auto"


def test_resuming_keeps_the_runs_precision_instead_of_choosing_again(tmp_path, monkeypatch, capsys):
    """A run that chose bf16 resumes in bf16, said as the run's recorded precision; where this CPU
    only emulates bf16, `auto` chooses again and says so; an explicit precision is obeyed, with a
    note."""
    from transduce.cli import main

    monkeypatch.setattr(precision, "read_capability", lambda device: AMX)
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    common = [
        "--run-dir",
        str(run),
        "--threads",
        "1",
        "--quiet",
        "--no-tensorboard",
        "--valid-every",
        "0",
        "--save-every-minutes",
        "0",
        "--save-every-steps",
        "1",
    ]
    first = [
        "--data",
        str(data),
        "--set",
        "model.n_layers=1",
        "--set",
        "model.d_model=16",
        "--set",
        "model.d_ff=32",
        "--set",
        "model.n_heads=2",
        "--batch-tokens",
        "64",
        "--max-steps",
        "1",
    ]
    assert main(["train", *first, *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (auto: Intel Xeon" in out and "in this session" not in out

    def state(step):
        return json.loads((run / "checkpoints" / f"step_{step:07d}" / "trainer_state.json").read_text())

    assert state(1)["precision"] == "bf16"
    assert main(["train", "--max-steps", "2", *common]) == 0
    out = capsys.readouterr().out
    assert (
        "precision: bf16 (auto: this run's precision, recorded in its checkpoint step_0000001; "
        "kept on resuming, not chosen again)"
    ) in out
    assert "s of training steps in this session (from step 1; the run's training time over all sessions" in out
    assert state(2)["precision"] == "bf16"

    monkeypatch.setattr(precision, "read_capability", lambda device: ZEN3)  # the run moved to a CPU without bf16
    assert main(["train", "--max-steps", "3", *common]) == 0
    out = capsys.readouterr().out
    assert (
        "note: this run trained in bf16 until step_0000002, which this CPU does not compute natively: choosing again"
        in out
    )
    assert "precision: fp32 (auto: AMD EPYC (Zen 3)" in out and state(3)["precision"] == "fp32"

    assert main(["train", "--max-steps", "4", "--precision", "bf16", *common]) == 0
    out = capsys.readouterr().out
    assert "note: this run trained in fp32 until step_0000003; it continues in bf16, as asked" in out
    assert state(4)["precision"] == "bf16"


def test_resuming_past_a_damaged_checkpoint_names_the_one_it_resumes_from(tmp_path, monkeypatch, capsys):
    """The precision line names the checkpoint the run resumes from, not the damaged newest one
    that `restore` then sets aside."""
    from transduce.cli import main

    monkeypatch.setattr(precision, "read_capability", lambda device: AMX)
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    common = [
        "--run-dir",
        str(run),
        "--threads",
        "1",
        "--quiet",
        "--no-tensorboard",
        "--valid-every",
        "0",
        "--save-every-minutes",
        "0",
        "--save-every-steps",
        "1",
        "--keep-last",
        "0",
    ]
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--set",
                "model.n_layers=1",
                "--set",
                "model.d_model=16",
                "--set",
                "model.d_ff=32",
                "--set",
                "model.n_heads=2",
                "--batch-tokens",
                "64",
                "--max-steps",
                "2",
                *common,
            ]
        )
        == 0
    )
    weights = run / "checkpoints" / "step_0000002" / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[len(damaged) * 2 // 3] ^= 0x10
    weights.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert main(["train", "--max-steps", "3", *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (auto: this run's precision, recorded in its checkpoint step_0000001;" in out
    assert "resuming from step_0000001, the newest intact checkpoint" in out and "step_0000002;" not in out
