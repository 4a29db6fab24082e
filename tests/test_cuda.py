"""The model, the cache, the search and training on a GPU, in fp32, bf16 (and fp16 training with
loss scaling): what the CPU tests pin, checked on CUDA against the CPU.

Runs where CUDA is available (skipped elsewhere, like tests/test_device.py's CUDA test), on
TRANSDUCE_TEST_DEVICE if set: `TRANSDUCE_TEST_DEVICE=cpu` runs the same checks on the CPU (what
`scripts/gpu_check.sh --dry` does, so that a GPU's minutes never go to a broken test).
`scripts/gpu_check.sh` runs this file on the GPU."""

import os

import pytest
import torch

from transduce.config import Config, ModelConfig
from transduce.data.vocab import BOS, EOS, PAD
from transduce.decoding.search import beam_search, greedy_decode
from transduce.masks import padding_mask
from transduce.model import Transformer
from transduce.synthetic import make_batch
from transduce.train.step import build_optimizer, make_grad_scaler, set_lr, train_step

DEVICE = os.environ.get("TRANSDUCE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
pytestmark = [
    pytest.mark.skipif(not DEVICE, reason="needs CUDA (or TRANSDUCE_TEST_DEVICE)"),
    pytest.mark.usefixtures("one_thread"),
]
PRECISIONS = ["fp32", "bf16"]


def autocast(precision: str):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(torch.device(DEVICE).type, dtype=dtype, enabled=dtype is not None)


def tiny(seed: int = 0, **knobs) -> Transformer:
    torch.manual_seed(seed)
    c = dict(src_vocab_size=40, n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    c.update(knobs)
    model = Transformer(ModelConfig(**c)).eval()
    with torch.no_grad():  # non-zero LayerNorm parameters and biases
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def batch(seed: int = 1, b: int = 5, vocab: int = 40):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 12, (b,), generator=g)
    src = torch.full((b, int(lens.max())), PAD)
    for i, n in enumerate(lens.tolist()):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    tgt = torch.cat([torch.full((b, 1), BOS), torch.randint(4, vocab, (b, 9), generator=g)], 1)
    return src, tgt


@pytest.mark.parametrize("precision", PRECISIONS)
def test_forward_on_the_device_matches_the_cpu(precision):
    cpu = tiny()
    src, tgt = batch()
    with torch.no_grad():
        ref = cpu(src, tgt)
        dev = tiny().to(DEVICE)
        with autocast(precision):
            out = dev(src.to(DEVICE), tgt.to(DEVICE)).float().cpu()
    tol = 1e-4 if precision == "fp32" else 0.1
    assert (out - ref).abs().max().item() < tol * max(1.0, ref.abs().max().item())
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean().item() > (0.999 if precision == "fp32" else 0.9)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_cached_decoding_equals_full_recomputation_on_the_device(precision):
    model = tiny().to(DEVICE)
    src, tgt = (x.to(DEVICE) for x in batch())
    with torch.no_grad(), autocast(precision):
        full = model(src, tgt).float()
        cache = model.init_cache(model.encode(src), padding_mask(src, PAD))
        steps = torch.cat([model.decode_step(tgt[:, i : i + 1], cache).float() for i in range(tgt.size(1))], 1)
    tol = 1e-4 if precision == "fp32" else 0.1
    assert (steps - full).abs().max().item() < tol * max(1.0, full.abs().max().item())


def test_beam_search_on_the_device_finds_what_the_cpu_finds():
    """fp32: the same hypotheses and (nearly) the same scores as on the CPU."""
    src, _ = batch(b=6)
    with torch.no_grad():
        ref = beam_search(tiny(), src, beam_size=4, alpha=0.6, max_len_offset=8, n_best=2, bos_id=BOS, eos_id=EOS)
        out = beam_search(
            tiny().to(DEVICE),
            src.to(DEVICE),
            beam_size=4,
            alpha=0.6,
            max_len_offset=8,
            n_best=2,
            bos_id=BOS,
            eos_id=EOS,
        )
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(ref, out))
    assert same >= len(ref) - 1  # a near-tie may flip on other hardware, rarely
    for a, b in zip(ref, out):
        if a[0].tokens == b[0].tokens:
            assert abs(a[0].score - b[0].score) < 1e-3


@pytest.mark.parametrize("precision", PRECISIONS)
def test_greedy_and_beam_search_run_on_the_device(precision):
    model = tiny().to(DEVICE)
    src = batch(b=6)[0].to(DEVICE)
    with torch.no_grad(), autocast(precision):
        greedy = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=8)
        beams = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=8, bos_id=BOS, eos_id=EOS)
    lens = (src != PAD).sum(1).tolist()
    assert all(len(g) <= n + 8 for g, n in zip(greedy, lens))
    assert all(len(b[0].tokens) <= n + 8 and b[0].score <= 0 for b, n in zip(beams, lens))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_steps_on_the_device_lower_the_loss(precision):
    """Adam (5.3), equation 3's rate, the trainer's `train_step` (fp16 with a GradScaler), on the
    reverse task: the loss falls by half within 150 steps."""
    if precision == "fp16" and torch.device(DEVICE).type != "cuda":
        pytest.skip("fp16 training needs CUDA (GradScaler)")
    torch.manual_seed(0)
    c = ModelConfig(src_vocab_size=14, n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    model = Transformer(c).to(DEVICE).train()
    opt = build_optimizer(model, Config(model=c))
    scaler = make_grad_scaler(torch.device(DEVICE), precision)
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(150):
        src, tgt_in, tgt_out = (x.to(DEVICE) for x in make_batch("reverse", 64, 10, 1, 8, g))
        set_lr(opt, min((step + 1) * 2e-4, 2e-3))
        r = train_step(
            model,
            opt,
            [{"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "ntokens": int((tgt_out != PAD).sum())}],
            label_smoothing=0.0,
            precision=precision,
            scaler=scaler,
            pad_id=PAD,
            smooth_exclude=(),
        )
        losses.append(r.sums[0].item() / int((tgt_out != PAD).sum()))
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first / 2, (first, last)


def test_flash_and_math_attention_agree_on_the_device():
    """SDPA's kernels (flash where the GPU has it, math) compute the same training forward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny(dropout=0.0).to(DEVICE)
    src, tgt = (x.to(DEVICE) for x in batch())
    with torch.no_grad(), autocast("bf16"):
        with sdpa_kernel([SDPBackend.MATH]):
            math = model(src, tgt).float()
        fast = model(src, tgt).float()  # whatever PyTorch chooses (flash / efficient on a GPU)
    assert (fast - math).abs().max().item() < 0.1 * max(1.0, math.abs().max().item())
