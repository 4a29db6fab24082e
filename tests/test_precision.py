"""`--precision auto`: each branch of the choice, with the capability read and the probe injected,
and the warning for bf16 where the CPU only emulates it (`transduce.precision`)."""

import json

import pytest
import torch

import transduce.precision as precision
from transduce.precision import Capability, choose_precision, probe_bf16_speedup, read_capability
from train_data import make_data

AMX = Capability("cpu", "Intel Xeon (Sapphire Rapids)", True, "AMX and avx512_bf16")
ZEN3 = Capability("cpu", "AMD EPYC (Zen 3)", False, "AVX2 only, no bf16 instructions (no AMX, no avx512_bf16)")
UNKNOWN = Capability("cpu", "riscv64", None, "bf16 support of riscv64 unknown")
H100 = Capability("cuda", "NVIDIA H100", True, "compute capability 9.0")
T4 = Capability("cuda", "Tesla T4", False, "compute capability 7.5")


def probe_returning(speedup, calls):
    def probe(**kwargs):
        calls.append(kwargs)
        return speedup
    return probe


def test_native_bf16_cpu_that_measures_faster_chooses_bf16():
    calls = []
    c = choose_precision("auto", "cpu", d_model=256, d_ff=1024, capability=AMX, probe=probe_returning(2.5, calls))
    assert c.precision == "bf16" and c.warning is None
    assert "AMX" in c.reason and "2.50x" in c.reason and c.line().startswith("precision: bf16 (")
    assert calls == [{"d_model": 256, "d_ff": 1024, "device": torch.device("cpu")}]  # the model's size is probed


def test_native_bf16_cpu_that_measures_slower_chooses_fp32():
    """Ambiguous: native bf16, but at this model size the casts cost more than they save."""
    c = choose_precision("auto", "cpu", capability=AMX, probe=probe_returning(0.8, []))
    assert c.precision == "fp32" and "0.80x" in c.reason


def test_cpu_without_bf16_chooses_fp32_without_probing():
    calls = []
    c = choose_precision("auto", "cpu", capability=ZEN3, probe=probe_returning(9.9, calls))
    assert c.precision == "fp32" and "no bf16 instructions" in c.reason and calls == []


def test_unknown_cpu_is_decided_by_the_probe():
    assert choose_precision("auto", "cpu", capability=UNKNOWN, probe=probe_returning(1.7, [])).precision == "bf16"
    assert choose_precision("auto", "cpu", capability=UNKNOWN, probe=probe_returning(0.5, [])).precision == "fp32"
    # near 1x the probe's noise could flip the choice between two runs: fp32 (exact) below the margin
    near = choose_precision("auto", "cpu", capability=UNKNOWN, probe=probe_returning(1.1, []))
    assert near.precision == "fp32" and "needs 1.25x" in near.line()


def test_cuda_follows_the_gpus_bf16_support_and_never_picks_fp16():
    calls = []
    assert choose_precision("auto", "cpu", capability=H100, probe=probe_returning(0.1, calls)).precision == "bf16"
    assert choose_precision("auto", "cpu", capability=T4, probe=probe_returning(9.0, calls)).precision == "fp32"
    assert calls == []


def test_explicit_bf16_on_an_emulating_cpu_warns_with_the_measured_slowdown():
    c = choose_precision("bf16", "cpu", capability=ZEN3, probe=probe_returning(0.2, []))
    assert c.precision == "bf16"
    assert "emulated" in c.warning and "5.0x slower than fp32" in c.warning and "auto would use fp32" in c.warning
    assert choose_precision("bf16", "cpu", capability=AMX, probe=probe_returning(0.2, [])).warning is None


def test_explicit_choices_are_obeyed_and_unknown_ones_rejected():
    assert choose_precision("fp32", capability=AMX).precision == "fp32"
    assert choose_precision("fp16", capability=AMX).precision == "fp16"
    with pytest.raises(ValueError, match="unknown precision"):
        choose_precision("int4", capability=AMX)


def test_this_machine_is_read_and_probed():
    cap = read_capability("cpu")
    assert cap.device == "cpu" and cap.native_bf16 in (True, False, None) and cap.name and cap.detail
    speedup = probe_bf16_speedup(d_model=64, d_ff=128, rows=64, budget_s=0.05)
    assert speedup > 0
    c = choose_precision("auto", "cpu", d_model=64, d_ff=128)
    assert c.precision in ("fp32", "bf16")
    if cap.native_bf16 is False:
        assert c.precision == "fp32"


def test_train_with_bf16_on_an_emulating_cpu_warns_and_auto_trains_fp32(tmp_path, monkeypatch, capsys):
    """The trainer says what it chose and why; `--precision bf16` where bf16 is emulated warns."""
    from transduce.cli import main

    monkeypatch.setattr(precision, "read_capability", lambda device: ZEN3)
    monkeypatch.setattr(precision, "probe_bf16_speedup", lambda **kw: 0.2)
    data = make_data(tmp_path / "data")
    common = ["--data", str(data), "--preset", "base", "--set", "model.n_layers=1", "--set", "model.d_model=16",
              "--set", "model.d_ff=32", "--set", "model.n_heads=2", "--threads", "1", "--no-progress",
              "--no-tensorboard", "--max-tokens", "64", "--max-steps", "2", "--valid-every", "0",
              "--save-every-minutes", "0"]
    assert main(["train", "--run-dir", str(tmp_path / "bf16"), "--precision", "bf16", *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (as asked; AMD EPYC (Zen 3)" in out
    assert "warning: bf16 is emulated on this CPU" in out and "5.0x slower than fp32" in out
    assert main(["train", "--run-dir", str(tmp_path / "auto"), *common]) == 0  # auto is the default
    out = capsys.readouterr().out
    assert "precision: fp32 (auto: AMD EPYC (Zen 3): AVX2 only" in out and "warning" not in out
    start = json.loads((tmp_path / "auto" / "logs" / "train.jsonl").read_text().splitlines()[0])
    assert start["precision"] == "fp32" and start["options"]["precision"] == "auto"


def test_resuming_keeps_the_runs_precision_instead_of_measuring_again(tmp_path, monkeypatch, capsys):
    """A run that chose bf16 resumes in bf16 though the probe would now say fp32 (a probe's noise
    must not change a run's precision midway); where this CPU only emulates bf16, `auto` chooses
    again and says so; an explicit precision is obeyed, with a note."""
    from transduce.cli import main

    calls = []
    monkeypatch.setattr(precision, "read_capability", lambda device: AMX)
    monkeypatch.setattr(precision, "probe_bf16_speedup", probe_returning(2.0, calls))
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    common = ["--run-dir", str(run), "--threads", "1", "--no-progress", "--no-tensorboard", "--valid-every", "0",
              "--save-every-minutes", "0", "--save-every-steps", "1"]
    first = ["--data", str(data), "--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", "model.d_ff=32",
             "--set", "model.n_heads=2", "--max-tokens", "64", "--max-steps", "1"]
    assert main(["train", *first, *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (auto: Intel Xeon" in out and len(calls) == 1 and "in this session" not in out

    def state(step):
        return json.loads((run / "checkpoints" / f"step_{step:07d}" / "trainer_state.json").read_text())

    assert state(1)["precision"] == "bf16"
    monkeypatch.setattr(precision, "probe_bf16_speedup", probe_returning(0.5, calls))  # would now choose fp32
    assert main(["train", "--resume", "--max-steps", "2", *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (auto: this run's precision, recorded in its checkpoint step_0000001; kept on resuming" in out
    assert "s of training steps in this session (from step 1; the run's training time over all sessions" in out
    assert len(calls) == 1 and state(2)["precision"] == "bf16"

    monkeypatch.setattr(precision, "read_capability", lambda device: ZEN3)  # the run moved to a CPU without bf16
    assert main(["train", "--resume", "--max-steps", "3", *common]) == 0
    out = capsys.readouterr().out
    assert "note: this run trained in bf16 until step_0000002, which this CPU does not compute natively: choosing again" in out
    assert "precision: fp32 (auto: AMD EPYC (Zen 3)" in out and state(3)["precision"] == "fp32"

    assert main(["train", "--resume", "--max-steps", "4", "--precision", "bf16", *common]) == 0
    out = capsys.readouterr().out
    assert "note: this run trained in fp32 until step_0000003; it continues in bf16, as asked" in out
    assert state(4)["precision"] == "bf16"


# -- decoding: `--precision auto` and `auto-int8` (`choose_decoding_precision`) -----------------


def timings(calls, **seconds):
    def probe(**kwargs):
        calls.append(kwargs)
        return {p: seconds[p] for p in kwargs["precisions"]}
    return probe


def test_decoding_auto_takes_bf16_only_where_measured_and_never_int8():
    from transduce.precision import choose_decoding_precision

    calls = []
    c = choose_decoding_precision("auto", "cpu", d_model=256, d_ff=1024, vocab=8000, capability=AMX,
                                  probe=timings(calls, fp32=1.0, bf16=0.5, int8=0.1))
    assert c.precision == "bf16" and "bf16 2.00x" in c.line() and "vocab 8,000" in c.line()
    assert calls[0]["precisions"] == ("fp32", "bf16")  # int8 is not a candidate of plain auto
    slow = choose_decoding_precision("auto", "cpu", capability=AMX, probe=timings([], fp32=1.0, bf16=0.9))
    assert slow.precision == "fp32" and "bf16 1.11x" in slow.line()


def test_decoding_auto_int8_takes_int8_at_its_margin_over_the_better_float():
    from transduce.int8 import can_int8
    from transduce.precision import INT8_MARGIN, choose_decoding_precision

    if not can_int8():
        pytest.skip("no oneDNN int8 kernels here: int8 is never a candidate (checked below)")
    c = choose_decoding_precision("auto-int8", "cpu", capability=AMX, probe=timings([], fp32=1.0, bf16=0.5, int8=0.3))
    assert c.precision == "int8" and c.base == "bf16" and "int8 3.33x" in c.line() and "auto-int8" in c.line()
    near = choose_decoding_precision("auto-int8", "cpu", capability=AMX,
                                     probe=timings([], fp32=1.0, bf16=0.5, int8=0.5 / (INT8_MARGIN - 0.05)))
    assert near.precision == "bf16"


def test_decoding_auto_never_probes_bf16_where_it_is_emulated():
    from transduce.int8 import can_int8
    from transduce.precision import choose_decoding_precision

    calls = []
    c = choose_decoding_precision("auto", "cpu", capability=ZEN3, probe=timings(calls, fp32=1.0, bf16=0.001))
    assert c.precision == "fp32" and "bf16 is emulated here, so not probed" in c.line() and calls == []
    assert "speed" not in c.line()  # no probe figures where nothing was measured
    calls = []
    c = choose_decoding_precision("auto-int8", "cpu", capability=ZEN3, probe=timings(calls, fp32=1.0, bf16=0.001, int8=0.5))
    if can_int8():
        assert calls[0]["precisions"] == ("fp32", "int8") and c.precision == "int8" and c.base == "fp32"


def test_decoding_probe_measures_every_precision_asked_for():
    from transduce.int8 import can_int8
    from transduce.precision import probe_decoding

    asked = ("fp32", "bf16") + (("int8",) if can_int8() else ())
    state = torch.random.get_rng_state()
    t = probe_decoding(d_model=32, d_ff=64, vocab=100, rows=8, precisions=asked, budget_s=0.05)
    assert set(t) == set(asked) and all(v > 0 for v in t.values())
    # int8 as the AMX default runs it: the projection alone in int8
    t = probe_decoding(d_model=32, d_ff=64, vocab=100, rows=8, precisions=asked, budget_s=0.05, int8_decoder=False)
    assert set(t) == set(asked) and all(v > 0 for v in t.values())
    assert torch.equal(torch.random.get_rng_state(), state)


def test_auto_int8_probes_int8_as_the_int8_mode_runs_it(monkeypatch):
    from transduce.int8 import can_int8
    from transduce.precision import choose_decoding_precision

    if not can_int8():
        pytest.skip("no oneDNN int8 kernels here: auto-int8 does not probe int8")
    calls = []

    def probe(**kwargs):
        calls.append(kwargs)
        return {"fp32": 1.0, "bf16": 0.5, "int8": 0.4}

    monkeypatch.delenv("TRANSDUCE_INT8_LAYERS", raising=False)
    for amx, decoder in ((True, False), (False, True)):
        monkeypatch.setattr("transduce.precision.amx_products", lambda amx=amx: amx)
        choose_decoding_precision("auto-int8", "cpu", capability=AMX, probe=probe)
        assert calls[-1]["int8_decoder"] is decoder


def test_decoding_explicit_and_gpu_choices():
    from transduce.precision import choose_decoding_precision

    assert choose_decoding_precision("fp32", capability=AMX).precision == "fp32"
    assert choose_decoding_precision("auto-int8", "cuda", capability=H100).precision == "bf16"
    with pytest.raises(ValueError, match="CPU only"):
        choose_decoding_precision("int8", "cuda", capability=H100)
    with pytest.raises(ValueError, match="unknown decoding precision"):
        choose_decoding_precision("fp16", capability=AMX)


# -- int8: every layer, or each product in int8 only where measured faster (`int8_layers`) --------


def test_int8_layers_the_decoders_by_default_without_measuring(monkeypatch):
    from transduce.int8 import can_int8
    from transduce.precision import int8_choice, int8_layers

    seen = []
    monkeypatch.delenv("TRANSDUCE_INT8_LAYERS", raising=False)
    monkeypatch.setattr("transduce.precision.amx_products", lambda: False)  # a CPU without AMX
    shapes = [(768, 256), (256, 256)]
    only, phrase = int8_layers(shapes, "bf16", lambda *a, **k: seen.append(a))
    assert only is None and phrase == "the decoder's linear layers and the output projection in int8 (the source side in bf16)"
    if can_int8():
        c = int8_choice("cpu", AMX, shapes=shapes)
        assert not c.int8_source and c.int8_decoder
    monkeypatch.setenv("TRANSDUCE_INT8_LAYERS", "ALL ")  # the source side too
    assert int8_layers(shapes, "bf16", lambda *a, **k: seen.append(a)) == (None, "every linear layer in int8")
    assert seen == []
    if can_int8():
        assert int8_choice("cpu", AMX, shapes=shapes).int8_source
    monkeypatch.setenv("TRANSDUCE_INT8_LAYERS", "some")
    with pytest.raises(ValueError, match="TRANSDUCE_INT8_LAYERS='some': use 'decoder'.*'output'.*'all'.*or 'measured'"):
        int8_layers(shapes, "bf16")


def test_int8_with_amx_puts_the_output_projection_alone_in_int8_unless_told(monkeypatch):
    """With AMX, bf16 products of the decoder's sizes beat int8 ones with their quantization
    (docs/speed.md): the default there is the vocabulary-sized projection alone in int8."""
    from transduce.int8 import can_int8
    from transduce.precision import int8_choice, int8_layers, int8_mode

    monkeypatch.delenv("TRANSDUCE_INT8_LAYERS", raising=False)
    monkeypatch.setattr("transduce.precision.amx_products", lambda: True)
    shapes = [(768, 256), (8000, 256)]
    assert int8_mode() == "output"
    only, phrase = int8_layers(shapes, "bf16", lambda *a, **k: pytest.fail("not measured"))
    assert only is None and phrase == "the output projection in int8"
    if can_int8():
        c = int8_choice("cpu", AMX, shapes=shapes)
        assert not c.int8_decoder and not c.int8_source and c.int8_options()["decoder"] is False
        assert "the output projection in int8 through oneDNN" in c.line()
        assert ("the decoder's other linear layers included (AMX: at their sizes bf16 products are faster than int8 "
                "ones with their quantization); the search in fp32)") in c.line()
    monkeypatch.setenv("TRANSDUCE_INT8_LAYERS", "decoder")  # told: every layer of the decoding step
    assert int8_mode() == "decoder"
    if can_int8():
        assert int8_choice("cpu", AMX, shapes=shapes).int8_decoder
    monkeypatch.setattr("transduce.precision.amx_products", lambda: False)
    monkeypatch.setenv("TRANSDUCE_INT8_LAYERS", "output")  # asked for without AMX: says so
    if can_int8():
        assert "the decoder's other linear layers included (TRANSDUCE_INT8_LAYERS=output)" in int8_choice(
            "cpu", AMX, shapes=shapes).line()


def test_amx_products_follow_the_cpu_and_onednns_isa_limit(monkeypatch):
    import torch

    from transduce.precision import amx_products

    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    for held, expected in (("", True), ("AVX512_CORE_AMX", True), ("all", True), ("AVX2", False),
                           ("AVX512_CORE_BF16", False), ("AVX10_1_512", False)):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
        assert amx_products() is expected, held
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert amx_products() is False


def test_int8_layers_measured_takes_the_shapes_measured_faster_at_the_margin(monkeypatch):
    from transduce.precision import INT8_LAYER_MARGIN, int8_choice, int8_layers
    from transduce.int8 import can_int8

    monkeypatch.setenv("TRANSDUCE_INT8_LAYERS", "measured")
    shapes = [(768, 256), (256, 256), (8000, 256), (256, 1024)]
    seen = []

    def probe(shapes, base):
        seen.append((tuple(shapes), base))
        return {(768, 256): (1.25, 1.0), (256, 256): (0.7, 1.0), (8000, 256): (1.6, 1.0),
                (256, 1024): (INT8_LAYER_MARGIN - 0.01, 1.0)}

    only, phrase = int8_layers(shapes, "bf16", probe)
    assert only == {(768, 256), (8000, 256)} and seen == [(tuple(shapes), "bf16")]
    assert "256->768 1.25x" in phrase and "kept in bf16: 256->256 0.70x, 1024->256 1.04x" in phrase
    # every shape faster: None (every layer), as quantize_int8's default
    assert int8_layers([(768, 256)], "fp32", probe)[0] is None
    if can_int8():
        c = int8_choice("cpu", AMX, shapes=shapes, probe=probe)
        assert c.int8_shapes == {(768, 256), (8000, 256)} and "kept in bf16" in c.line()


def test_probe_int8_measures_every_shape_in_both_types():
    from transduce.int8 import can_int8
    from transduce.precision import probe_int8

    if not can_int8():
        pytest.skip("no oneDNN int8 kernels here")
    t = probe_int8([(96, 32), (20000, 32)], rows=8, base="fp32", budget_s=0.01)
    assert set(t) == {(96, 32), (20000, 32)} and all(a > 0 and b > 0 for a, b in t.values())


def test_probes_multiply_by_the_whole_vocabulary_not_a_scaled_part(monkeypatch):
    # a product over 37,000 rows ran 1.8x slower per row than over 8,000 (int8 held to AVX2), so a
    # part of the vocabulary, scaled, would not measure the model at hand (docs/speed.md)
    from transduce import int8, kernels
    from transduce.precision import probe_decoding, probe_int8

    built = []
    for module, name in ((kernels, "PackedWeight"), (int8, "Int8Weight")):
        cls = getattr(module, name)
        monkeypatch.setattr(module, name, lambda w, *a, cls=cls, **k: built.append(tuple(w.shape)) or cls(w, *a, **k))
    asked = ("fp32",) + (("int8",) if int8.can_int8() else ())
    probe_decoding(d_model=16, d_ff=32, vocab=20000, rows=4, precisions=asked, budget_s=0.01)
    if kernels.can_pack(torch.float32, "cpu"):
        assert (20000, 16) in built and not any(out == 16384 for out, _ in built)
    if int8.can_int8():
        built.clear()
        t = probe_int8([(20000, 16)], rows=4, base="fp32", budget_s=0.01)
        assert built.count((20000, 16)) == (2 if kernels.can_pack(torch.float32, "cpu") else 1)
        assert set(t) == {(20000, 16)}


def test_resuming_past_a_damaged_checkpoint_names_the_one_it_resumes_from(tmp_path, monkeypatch, capsys):
    """The precision line names the checkpoint the run resumes from, not the damaged newest one
    that `restore` then sets aside."""
    from transduce.cli import main

    monkeypatch.setattr(precision, "read_capability", lambda device: AMX)
    monkeypatch.setattr(precision, "probe_bf16_speedup", probe_returning(2.0, []))
    data = make_data(tmp_path / "data")
    run = tmp_path / "run"
    common = ["--run-dir", str(run), "--threads", "1", "--no-progress", "--no-tensorboard", "--valid-every", "0",
              "--save-every-minutes", "0", "--save-every-steps", "1", "--keep-last", "0"]
    assert main(["train", "--data", str(data), "--set", "model.n_layers=1", "--set", "model.d_model=16",
                 "--set", "model.d_ff=32", "--set", "model.n_heads=2", "--max-tokens", "64", "--max-steps", "2",
                 *common]) == 0
    weights = run / "checkpoints" / "step_0000002" / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[len(damaged) * 2 // 3] ^= 0x10
    weights.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert main(["train", "--resume", "--max-steps", "3", *common]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16 (auto: this run's precision, recorded in its checkpoint step_0000001;" in out
    assert "resuming from step_0000001, the newest intact checkpoint" in out and "step_0000002;" not in out
