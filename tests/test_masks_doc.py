"""docs/masks.md's conversion code, run as written, against `nn.Transformer`.

The page's Python block defines `to_pytorch` (transduce's masks -> nn.Transformer's arguments)
and `from_pytorch` (nn.Transformer's arguments -> transduce's three masks). Both are checked
numerically: a two-layer nn.Transformer holding the same weights as transduce's layers must
compute the same outputs on every real position of a padded batch (fp32, eval mode)."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from transduce.masks import make_masks
from transduce.model import DecoderLayer, EncoderLayer

from test_masks import (
    EPS,
    FF,
    PAD,
    E,
    H,
    B,
    S,
    T,
    allowed_somewhere,
    as_float,
    config,
    nn_layer,
    nn_state,
    randomize,
    tokens,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "masks.md"


def doc_code() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/masks.md: one python block, the conversion code"
    scope: dict = {}
    exec(compile(blocks[0], str(DOC), "exec"), scope)  # noqa: S102 - the docs' own code
    return scope


CODE = doc_code()
to_pytorch, from_pytorch = CODE["to_pytorch"], CODE["from_pytorch"]


@pytest.fixture()
def batch():
    gen = torch.Generator().manual_seed(1)
    src, tgt = tokens([7, 4, 2], S, gen), tokens([3, 5, 1], T, gen)
    return src, tgt, torch.randn(B, S, E, generator=gen), torch.randn(B, T, E, generator=gen)


@pytest.fixture()
def models():
    """transduce layers and an nn.Transformer with the same weights (2 layers each side)."""
    c = config(n_layers=2)
    enc = [randomize(EncoderLayer(c), 40 + i) for i in range(2)]
    dec = [randomize(DecoderLayer(c), 50 + i) for i in range(2)]
    encoder = nn.TransformerEncoder(nn_layer(enc[0]), 2, norm=None, enable_nested_tensor=False)
    decoder = nn.TransformerDecoder(nn_layer(dec[0]), 2, norm=None)
    model = nn.Transformer(
        E,
        H,
        2,
        2,
        FF,
        dropout=0.0,
        custom_encoder=encoder,
        custom_decoder=decoder,
        layer_norm_eps=EPS,
        batch_first=True,
    ).eval()
    for ours, theirs in zip(enc + dec, list(model.encoder.layers) + list(model.decoder.layers)):
        theirs.load_state_dict(nn_state(ours))
    return enc, dec, model


def ours(enc, dec, x, y, encoder_mask, decoder_self_mask, decoder_cross_mask):
    memory = x
    for layer in enc:
        memory, _ = layer(memory, encoder_mask)
    out = y
    for layer in dec:
        out, _, _ = layer(out, memory, decoder_self_mask, decoder_cross_mask)
    return out


def test_to_pytorch_gives_nn_transformer_transduces_masks(batch, models):
    src, tgt, x, y = batch
    enc, dec, model = models
    src_mask, tgt_mask = make_masks(src, tgt, PAD)
    expected = ours(enc, dec, x, y, src_mask, tgt_mask, src_mask)
    with torch.no_grad():
        out = model(x, y, **to_pytorch(src, tgt, PAD))
    real = tgt != PAD
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    # The same with the float causal mask PyTorch itself makes (and float padding masks).
    kw = to_pytorch(src, tgt, PAD)
    kw["tgt_mask"] = nn.Transformer.generate_square_subsequent_mask(T)
    for name in ("src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"):
        kw[name] = as_float(kw[name])
    with torch.no_grad():
        out = model(x, y, **kw)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)


def test_round_trip_is_make_masks(batch):
    src, tgt, _, _ = batch
    src_mask, tgt_mask = make_masks(src, tgt, PAD)
    encoder, decoder_self, decoder_cross = from_pytorch(B, H, S, T, **to_pytorch(src, tgt, PAD))
    assert torch.equal(encoder, src_mask) and torch.equal(decoder_cross, src_mask)
    assert torch.equal(decoder_self, tgt_mask)


@pytest.mark.parametrize("form", ["bool", "float"])
@pytest.mark.parametrize("per_head", [False, True], ids=["(L,S)", "(B*h,L,S)"])
def test_from_pytorch_gives_transduce_nn_transformers_masks(batch, models, form, per_head):
    src, tgt, x, y = batch
    enc, dec, model = models

    def mask(q, k, seed):  # True = blocked, never a whole row
        if not per_head:
            return allowed_somewhere(q, k, seed)
        return torch.stack([allowed_somewhere(q, k, seed + i) for i in range(B * H)])

    f = as_float if form == "float" else (lambda m: m)
    kw = dict(
        src_mask=f(mask(S, S, 60)),
        tgt_mask=f(mask(T, T, 70)),
        memory_mask=f(mask(T, S, 80)),
        src_key_padding_mask=f(src == PAD),
        tgt_key_padding_mask=f(tgt == PAD),
        memory_key_padding_mask=f(src == PAD),
    )
    with torch.no_grad():
        out = model(x, y, **kw)
    expected = ours(enc, dec, x, y, *from_pytorch(B, H, S, T, **kw))
    real = tgt != PAD
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    plain = ours(enc, dec, x, y, *make_masks(src, tgt, PAD), make_masks(src, tgt, PAD)[0])
    assert not torch.allclose(plain[real], expected[real], atol=1e-3)  # the extra masks mattered


def test_a_float_bias_is_not_a_mask():
    with pytest.raises(ValueError, match="bias, not a mask"):
        from_pytorch(1, 1, 2, 2, src_mask=torch.tensor([[0.0, 0.5], [0.0, 0.0]]))
