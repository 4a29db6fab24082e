"""int8 decoding (`--precision int8`, `transduce.fast.int8.quantize_int8`): close to fp32, applied
and undone from outside the model, composing with the CPU packing, and reachable from
`translate`, `evaluate` and `serve`; the fp32 path stays exact."""

import argparse
import json

import pytest
import torch

from tiny_models import SRC_WORDS, make_model, sentences
from transduce.fast import decode as kernels
from transduce import cpu
from transduce.fast import int8
from transduce.cli import main
from transduce.config import ModelConfig
from transduce.masks import padding_mask
from transduce.model import Transformer
from transduce.decoding.ready import load_translation_model, make_ready
from transduce.decoding.translate import translate_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def model_and_batch(**knobs):
    torch.manual_seed(0)
    c = dict(src_vocab_size=60, n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    c.update(knobs)
    model = Transformer(ModelConfig(**c)).eval()
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(4, 60, (4, 9), generator=g), torch.randint(4, 60, (4, 7), generator=g)


def test_int8_logits_are_close_to_fp32_and_undoing_it_is_exact():
    model, src, tgt = model_and_batch()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        ref, memory = model(src, tgt), model.encode(src)
        n = int8.quantize_int8(model)
        # every nn.Linear: the decoder's ([W^Q; W^K; W^V], W^O, the FFN's two, the cross-attention's
        # two), the encoder's (its attention's two, the FFN's two), and the tied pre-softmax projection
        assert n == 2 * 6 + 2 * 4 + 1 and isinstance(model.output_proj, int8.Int8Linear)
        assert int8.is_int8(model) and not kernels.is_packed(model)
        linears = [m for m in model.encoder.modules() if isinstance(m, (torch.nn.Linear, kernels.PackedLinear))]
        assert len(linears) == 2 * 4 and all(isinstance(m, int8.Int8Linear) for m in linears)
        q_memory = model.encode(src)
        assert not torch.equal(q_memory, memory) and (q_memory - memory).abs().max() < 0.05 * memory.abs().max()
        for layer in model.decoder.layers:  # encoder-decoder attention's query block and key/value block
            blocks = layer.cross_attn.in_proj.packed
            for rows in (layer.cross_attn.kv_rows, layer.cross_attn.q_rows):
                assert isinstance(blocks[(rows.start, rows.stop, None)], int8.Int8Weight)
        q = model(src, tgt)
        assert not torch.equal(q, ref)  # the int8 kernels ran
        assert (q - ref).abs().max().item() < 0.05 * ref.abs().max().item()
        # where pairs add in int16 (no VNNI: AVX2, AVX-512 without VNNI) the weights take 7 bits, twice
        # the rounding step of the 8 they take elsewhere, and the probabilities differ twice as much
        atol = 0.02 if int8.int8_saturates() else 0.01  # the feature test, `transduce.cpu`'s
        assert torch.allclose(q.log_softmax(-1).exp(), ref.log_softmax(-1).exp(), atol=atol)
        assert (q.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
        int8.dequantize_int8(model)
        assert torch.equal(model(src, tgt), ref) and model.output_proj is None
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # parameters untouched


def test_int8_projection_alone_leaves_the_decoder_to_packing():
    """`decoder=False` (what `--precision int8` does with AMX): the tied pre-softmax
    projection alone in int8; the decoder's layers stay float layers, which packing then takes."""
    model, src, tgt = model_and_batch()
    with torch.inference_mode():
        kernels.pack_weights(model)
        packed = model(src, tgt)
        kernels.unpack_weights(model)
        assert int8.quantize_int8(model, decoder=False) == 1
        assert isinstance(model.output_proj, int8.Int8Linear)
        assert not any(isinstance(m, int8.Int8Linear) for m in model.decoder.modules())
        assert kernels.pack_weights(model)  # the float layers left
        assert isinstance(model.decoder.layers[0].self_attn.in_proj, kernels.PackedLinear)
        q = model(src, tgt)
        assert not torch.equal(q, packed) and (q - packed).abs().max().item() < 0.05 * packed.abs().max().item()
        assert (q.argmax(-1) == packed.argmax(-1)).float().mean().item() >= 0.9
        kernels.unpack_weights(model)
        int8.dequantize_int8(model)
        assert model.output_proj is None and not int8.is_int8(model)


def test_int8_composes_with_packing_and_trains_in_fp32():
    model, src, tgt = model_and_batch()
    int8.quantize_int8(model, decoder=False)
    undo = make_ready(model)  # packs what int8 left in fp32, as `load_for_decoding` does
    in_proj = model.decoder.layers[0].self_attn.in_proj
    assert isinstance(in_proj, kernels.PackedLinear) == kernels.can_pack(torch.float32, "cpu")
    assert not isinstance(in_proj, int8.Int8Linear) and isinstance(model.output_proj, int8.Int8Linear)
    undo()
    assert int8.is_int8(model) and not kernels.is_packed(model)  # make_ready's undo leaves the int8 layers
    # with autograd the layers compute in fp32 (F.linear): a training step sees the exact model
    model.train()
    out = model(src, tgt)
    int8.dequantize_int8(model)
    assert torch.equal(out, model(src, tgt))


def test_int8_refuses_what_it_cannot_run():
    model, _, _ = model_and_batch()
    with pytest.raises(ValueError, match="fp32 or bf16 weights"):
        int8.quantize_int8(model.to(torch.float16))


def test_int8_over_bf16_weights_takes_and_gives_bf16_with_fp32_logits():
    model, src, tgt = model_and_batch()
    model.to(torch.bfloat16)
    with torch.inference_mode():
        ref = model(src, tgt).float()
        int8.quantize_int8(model)
        assert any(isinstance(m, kernels.PackedFeedForward) for m in model.modules())  # the ReLU in the int8 product
        hidden = model.decoder(tgt, model.encode(src), padding_mask(src, model.config.pad_id), None)[0]
        assert hidden.dtype == torch.bfloat16  # the layers take and give bf16
        q = model(src, tgt)
        assert q.dtype == torch.float32 and not torch.equal(q, ref)  # the pre-softmax projection: fp32 logits
        assert (q.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
        assert (q.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
        int8.dequantize_int8(model)
        assert torch.equal(model(src, tgt).float(), ref)


def test_activations_are_quantized_within_half_a_step():
    levels = int8.LEVELS
    g = torch.Generator().manual_seed(0)
    for x in (
        torch.randn(7, 33, generator=g) * 3,
        torch.rand(5, 64, generator=g) + 0.5,
        -torch.rand(3, 8, generator=g),
        torch.zeros(2, 4),
        torch.randn(4, 16, generator=g).bfloat16(),
    ):
        q, scale, zero = int8.quantize_activations(x)
        assert q.dtype == torch.uint8 and q.shape == x.shape and 0 <= zero <= levels
        assert int(q.max()) <= levels
        back = (q.float() - zero) * scale
        assert (back - x.float()).abs().max().item() <= scale / 2 * 1.001 + 1e-7


def test_int8_saturation_test_matches_the_cpus_flags():
    """Pairs add in int16 exactly where oneDNN has no VNNI or AMX int8 (the CPU lacks them, or
    ONEDNN_MAX_CPU_ISA holds oneDNN below them): both answers are reachable (the subprocess test
    below holds this CPU to AVX2)."""
    from transduce import cpu

    assert cpu.int8_saturates() is (not cpu.has_vnni())


_WORST_CASE = """
import torch
from transduce import cpu
from transduce.fast import int8
assert cpu.int8_saturates(), "held to AVX2, oneDNN should add u8 x s8 pairs in int16"
# every pair at its largest: activations at the top of their range, weights at +-max of their row
x = torch.full((4, 256), 3.0)
x[:, 0] = 0.0  # the range includes 0: the zero point is 0, 3.0 quantizes to 254
w = torch.ones(8, 256) * 0.5
w[1::2] *= -1
out = int8.Int8Weight(w)(x, None)
exact = x @ w.T
assert torch.allclose(out, exact, rtol=1e-2), (out[:, :2], exact[:, :2])
print("ok")
"""


@pytest.mark.skipif(not int8.can_int8(), reason="no oneDNN int8 kernels here")
def test_int8_products_do_not_saturate_where_pairs_add_in_int16(tmp_path):
    """Held to AVX2 (no VNNI), oneDNN adds u8 x s8 pairs in int16 with saturation: with 8-bit
    activations the weights take 7 bits (+-63), so the largest pair sum, 254 * 63 * 2, still fits;
    8-bit weights there would clip this product to a fraction of its value."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _WORST_CASE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr[-2000:]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("int8"), d_model=64, d_ff=128)


def test_translate_int8_is_close_to_fp32_and_fp32_stays_exact(model_dir, tmp_path, capsys):
    lines = sentences(SRC_WORDS, 24, seed=5)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ["--beam", "3", "--max-len-offset", "6", "--threads", "1", "-i", str(src)]
    assert main(["translate", str(model_dir), *flags, "-o", str(tmp_path / "int8.txt"), "--int8"]) == 0
    assert "precision: int8 (as asked" in capsys.readouterr().err
    assert (
        main(["translate", str(model_dir), *flags, "-o", str(tmp_path / "fp32.txt"), "--precision", "fp32", "-q"]) == 0
    )
    quantized = (tmp_path / "int8.txt").read_text(encoding="utf-8").splitlines()
    fp32 = (tmp_path / "fp32.txt").read_text(encoding="utf-8").splitlines()
    assert len(quantized) == len(fp32) == len(lines)
    assert sum(a == b for a, b in zip(quantized, fp32)) >= 0.75 * len(lines)
    loaded = load_translation_model(model_dir)  # the fp32 path: what the library gives without any option
    assert fp32 == translate_lines(loaded.model, loaded.src_vocab, loaded.tgt_vocab, lines, beam=3, max_len_offset=6)


def test_evaluate_int8_records_the_precision(model_dir, tmp_path):
    lines = sentences(SRC_WORDS, 6, seed=7)
    (tmp_path / "src.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "evaluate",
                str(model_dir),
                "--input",
                str(tmp_path / "src.txt"),
                "--ref",
                str(tmp_path / "ref.txt"),
                "--tgt",
                "en",
                "--precision",
                "int8",
                "--beam",
                "2",
                "--max-len-offset",
                "4",
                "--threads",
                "1",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["decoding"]["precision"] == "int8"


def test_serve_int8_engine(model_dir):
    pytest.importorskip("fastapi")
    from transduce.cli import serve as serve_cli
    from transduce.decoding.settings import SearchSettings

    p = argparse.ArgumentParser()
    serve_cli.add_args(p)
    args = p.parse_args([str(model_dir), "--precision", "int8", "--threads", "1"])
    engine = serve_cli.engine_loader(args, serve_cli.check_args(args))()
    assert engine.info["precision"] == "int8"
    out = engine.translate(["a man runs on the grass", ""], SearchSettings(beam=2, max_len_offset=3))
    assert len(out) == 2 and out[1][0].text == ""


def test_int8_off_the_cpu_is_a_one_line_error(model_dir, capsys):
    from transduce.precision import choose_precision

    with pytest.raises(ValueError, match="CPU only"):
        choose_precision("int8", "cuda")
    assert main(["translate", str(model_dir), "--int8", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def test_translate_auto_int8_says_what_it_chose_and_why(model_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a man runs on the grass\n", encoding="utf-8")
    assert (
        main(
            [
                "translate",
                str(model_dir),
                "--precision",
                "auto-int8",
                "--beam",
                "2",
                "--threads",
                "1",
                "-i",
                str(src),
                "-o",
                str(tmp_path / "out.txt"),
            ]
        )
        == 0
    )
    from transduce.precision import choose_decoding_precision

    line = next(x for x in capsys.readouterr().err.splitlines() if "precision:" in x)
    assert line.endswith(choose_decoding_precision("auto-int8").line()) and "auto-int8:" in line
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 1


def test_int8_lets_no_deprecation_warning_out_and_holds_no_quantized_tensor_outside_fbgemm():
    """oneDNN's path takes plain int8/uint8 tensors into its qlinear (no torch.qint8, whose creation
    functions torch 2.13 announces as deprecated). FBGEMM's (where `int8_kernel` picks it: this
    CPU adds u8 x s8 pairs in int16) takes its weights as a qint8 tensor, made under that warning
    alone and held only inside its packed weight. Either way no warning reaches the user."""
    import warnings

    model, src, tgt = model_and_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        int8.quantize_int8(model)
        with torch.inference_mode():
            model(src, tgt)
    weights = [
        w
        for m in model.modules()
        if isinstance(m, int8.Int8Linear)
        for w in m.packed.values()
        if isinstance(w, int8.Int8Weight)
    ]  # (cross-attention's key/value block: a packed float)
    assert weights and {w.kernel for w in weights} == {int8.int8_kernel(torch.float32)}
    for w in weights:
        if w.kernel == "onednn":
            assert not w.weight.is_quantized and w.weight.dtype == torch.int8
        else:
            assert isinstance(w.weight, torch.ScriptObject) and w.zeros is None


def test_int8_kernel_follows_the_saturation_test():
    """FBGEMM's int8 product where pairs add in int16 (7-bit weights, fp32 activations), oneDNN's
    elsewhere and for bf16 activations. Depends on this CPU: which branch runs is `int8_saturates`'s."""
    from transduce import torch_ops

    fbgemm = cpu.int8_saturates() and torch_ops.has("fbgemm")
    assert int8.int8_kernel(torch.float32) == ("fbgemm" if fbgemm else "onednn")
    assert int8.int8_kernel(torch.bfloat16) == "onednn"


def test_fbgemm_product_matches_onednn_within_a_step(monkeypatch):
    """Where both kernels run here, FBGEMM's product, ReLU and bias (packed with the weights, a
    block's rows too) agree with oneDNN's to within the activations' quantization step."""
    from transduce import torch_ops

    if not (torch_ops.has("fbgemm") and int8.can_int8()):
        pytest.skip("needs both FBGEMM's and oneDNN's int8 kernels in this torch build")
    torch.manual_seed(0)
    w, b, x = torch.randn(96, 64) * 0.1, torch.randn(96), torch.randn(3, 7, 64)
    for rows in (None, slice(32, 64)):
        monkeypatch.setattr(int8, "int8_kernel", lambda dtype: "fbgemm")
        f = int8.Int8Weight(w, rows, b)
        monkeypatch.setattr(int8, "int8_kernel", lambda dtype: "onednn")
        o = int8.Int8Weight(w, rows, b)
        bias = b if rows is None else b[rows]
        for act in ("none", "relu"):
            yf, yo = f(x, bias, act), o(x, bias, act)
            assert yf.shape == yo.shape == (3, 7, 96 if rows is None else 32)
            assert (yf - yo).abs().max() < 0.05, act


def test_int8_quantized_as_read_decodes_as_quantized_after_loading(model_dir):
    # load_for_decoding quantizes each part as it is read (fast.int8.quantize_part): when a decoder
    # layer is read, the layers before it hold no float linear weight, and the ones after are not read yet
    from transduce.decoding.ready import load_for_decoding
    from transduce.fast.decode import PackedLinear

    seen = []
    real = int8.quantize_part

    def spy(part, decoder=True, dtype=None):
        if isinstance(part, Transformer):
            spy.model = part
            seen.append(("Transformer", 0, 0))
        elif part in list(spy.model.decoder.layers):
            layers = spy.model.decoder.layers
            i = next(i for i, layer in enumerate(layers) if layer is part)
            before = [m for layer in layers[:i] for m in layer.modules() if isinstance(m, torch.nn.Linear)]
            after = [p for layer in layers[i + 1 :] for p in layer.parameters() if not p.is_meta]
            seen.append(("DecoderLayer", len(before), len(after)))
        real(part, decoder, dtype)

    int8.quantize_part = spy
    try:
        loaded = load_for_decoding(model_dir, precision="int8", threads=1, keep_freed=False)
    finally:
        int8.quantize_part = real
    n = loaded.config.model.n_layers
    assert seen[0] == ("Transformer", 0, 0)
    assert [s for s in seen if s[0] == "DecoderLayer"] == [("DecoderLayer", 0, 0)] * n
    assert isinstance(loaded.model.decoder.embed, int8.Int8Embeddings)

    later = load_translation_model(model_dir)  # read whole in fp32, then quantized: the same int8 model
    make_ready(later.model, loaded.precision, keep=False)
    assert all(
        isinstance(m, PackedLinear) for m in loaded.model.encoder.layers[0].modules() if "Linear" in type(m).__name__
    )
    lines = sentences(SRC_WORDS, 12, seed=9)
    outputs = [
        translate_lines(m, later.src_vocab, later.tgt_vocab, lines, beam=3, max_len_offset=6)
        for m in (loaded.model, later.model)
    ]
    assert outputs[0] == outputs[1]


def test_int8_over_bf16_quantized_as_read_holds_what_quantizing_after_loading_holds(model_dir):
    # where bf16 is native (Zen 4, AMX) int8 runs over bf16: the model is read in bf16 and quantized as read,
    # before `make_ready` casts it; every tensor held, and its dtype, as when the whole model is quantized after loading
    import dataclasses
    import functools

    from transduce.precision import choose_decoding_precision

    choice = dataclasses.replace(choose_decoding_precision("int8", torch.device("cpu")), base="bf16")
    after = load_translation_model(model_dir, dtype=torch.bfloat16)
    make_ready(after.model, choice, keep=False)
    read = load_translation_model(
        model_dir, dtype=torch.bfloat16, as_filled=functools.partial(int8.quantize_part, decoder=choice.int8_decoder)
    )
    make_ready(read.model, choice, keep=False)

    def held(model):
        out = {}
        for name, module in model.named_modules():
            tensors = {**vars(module), **module._parameters, **module._buffers}
            out.update({f"{name}.{k}": v for k, v in tensors.items() if isinstance(v, torch.Tensor)})
        return out

    a, b = held(after.model), held(read.model)
    assert a.keys() == b.keys() and a
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_rows_is_the_symmetric_per_row_formula(dtype):
    """q_i = round(W_i / s_i) with s_i = max|W_i| / Q (Q 63 where `int8_saturates`, else 127), a
    zero row kept finite, for a matrix of more rows than one block; in the dtype's own values."""
    torch.manual_seed(0)
    w = (torch.randn(4096 + 37, 48) * 0.05).to(dtype)
    w[5] = 0
    q, s = int8.quantize_rows(w)
    top = 63 if int8.int8_saturates() else 127
    want_s = w.float().abs().amax(dim=1).clamp_min(1e-12) / top
    assert torch.equal(s, want_s)
    assert torch.equal(q, torch.round(w.float() / want_s[:, None]).clamp(-top, top).to(torch.int8))
    assert q.dtype == torch.int8 and int(q.abs().max()) == top and not q[5].any()


@pytest.mark.parametrize("kernel", ["fbgemm", "onednn"])
def test_packing_behind_packs_every_weight_by_its_end_and_raises_its_errors(kernel, monkeypatch):
    """`packing_behind`: each kernel's packing in a thread while the model is read, every weight
    packed (or its error raised) as the block ends, the products those of packing in place. Runs
    where this torch has the kernel (picked here whatever `int8_kernel` says for this CPU)."""
    from transduce import torch_ops

    if not (int8.can_int8() and (kernel == "onednn" or torch_ops.has("fbgemm"))):
        pytest.skip(f"needs {kernel}'s int8 kernels in this torch build")
    monkeypatch.setattr(int8, "int8_kernel", lambda dtype: kernel)
    torch.manual_seed(0)
    w, b, x = torch.randn(96, 64) * 0.1, torch.randn(96), torch.randn(3, 64)
    with int8.packing_behind():
        behind = [int8.Int8Weight(w, rows, b) for rows in (None, slice(32, 64))]
    assert all("_packing" not in v.__dict__ for v in behind)
    for v, rows in zip(behind, (None, slice(32, 64))):
        here = int8.Int8Weight(w, rows, b)
        bias = b if rows is None else b[rows]
        assert torch.equal(v(x, bias), here(x, bias))

    def broken(*args):
        raise RuntimeError("packing failed")

    monkeypatch.setattr(torch_ops, "fbgemm_prepack" if kernel == "fbgemm" else "int8_pack", broken)
    with pytest.raises(RuntimeError, match="packing failed"):
        with int8.packing_behind():
            int8.Int8Weight(w, None, b)


def test_fbgemm_projection_in_parts_of_rows_decodes_as_one_product_when_one_part_holds_them(model_dir, monkeypatch):
    """Where FBGEMM runs the pre-softmax projection (`Int8Linear.rows_per_call`), the search projects
    `FBGEMM_ROWS` rows at a time, each part ranked as made (`decoding.ranking.ProjectedRows`); with
    one part holding every row it decodes exactly as the whole step's logits at once (FBGEMM's
    activations quantized per call: smaller parts quantize each part's rows on their own). Runs
    where this torch has FBGEMM, on any CPU (FBGEMM picked here whatever `int8_kernel` says)."""
    import dataclasses

    from transduce import precision, torch_ops
    from transduce.decoding import search
    from transduce.decoding.ready import load_for_decoding

    if not (torch_ops.has("fbgemm") and int8.can_int8()):
        pytest.skip("needs FBGEMM's int8 kernels in this torch build")
    monkeypatch.setattr(int8, "int8_kernel", lambda dtype: "fbgemm")
    real = precision.read_capability  # FBGEMM takes fp32 activations: the rest in fp32, as where bf16 is not native
    monkeypatch.setattr(
        precision, "read_capability", lambda device="cpu": dataclasses.replace(real(device), features=frozenset())
    )
    loaded = load_for_decoding(model_dir, precision="int8", threads=1, keep_freed=False)
    model = loaded.model
    assert search.projection_rows(model) == int8.FBGEMM_ROWS
    src = torch.tensor([loaded.src_vocab.encode(line) + [loaded.src_vocab.eos] for line in ["a b c d", "b c d a"]])
    monkeypatch.setattr(int8, "FBGEMM_ROWS", 1 << 20)
    with torch.inference_mode():
        parts = search.beam_search(model, src, beam_size=3, max_len_offset=5)
        monkeypatch.setattr(search, "projection_rows", lambda model: None)
        whole = search.beam_search(model, src, beam_size=3, max_len_offset=5)
    assert [[(h.tokens, h.score) for h in hs] for hs in parts] == [[(h.tokens, h.score) for h in hs] for hs in whole]
