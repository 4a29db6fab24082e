"""transduce's masks against PyTorch's: the mapping in docs/paper_map.md, checked numerically.

transduce has one mask convention (bool, True = may attend, `make_masks`); `nn.Transformer` has six
masks and three `*_is_causal` flags with the opposite polarity (bool True = blocked, float added to
the scores). The table "The mask convention" in docs/paper_map.md gives, for every argument of
`nn.Transformer.forward`, what to pass for transduce's masks and which transduce mask a given
argument means. The expressions in that table are evaluated here, not copied: each one is fed to
`nn.MultiheadAttention`, `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer` or
`nn.Transformer` holding the same weights as transduce's modules, and the outputs must agree with
transduce's on every real (non-pad) query position, in fp32 on the CPU, in eval mode.
"""

import inspect
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from transduce.config import ModelConfig
from transduce.masks import causal_mask, make_masks, padding_mask
from transduce.model import DecoderLayer, EncoderLayer, MultiHeadAttention

DOC = Path(__file__).resolve().parents[1] / "docs" / "paper_map.md"

PAD = 0
B, S, T = 3, 7, 5
E, H, FF, EPS = 32, 4, 64, 1e-6
SRC_LENGTHS, TGT_LENGTHS = [7, 4, 2], [3, 5, 1]
ATOL = RTOL = 1e-5

# What transduce and nn.Transformer call each sub-layer's parameters.
NN_NAMES = [
    ("in_proj.weight", "in_proj_weight"),
    ("in_proj.bias", "in_proj_bias"),
    ("cross_attn.", "multihead_attn."),
    ("feed_forward.w_1.", "linear1."),
    ("feed_forward.w_2.", "linear2."),
]


# ---------------------------------------------------------------------------------------------
# The table in the docs, as code
# ---------------------------------------------------------------------------------------------


def doc_table() -> dict[str, tuple[list[str], list[str]]]:
    """{nn argument: (expressions to pass for transduce's masks, transduce's mask for `a`)}: the
    section's list, an item per argument (`- **`name`** · *field*: value · ...`, wrapped onto
    indented lines)."""
    section = DOC.read_text(encoding="utf-8").split("## The mask convention", 1)[1].split("\n## ", 1)[0]
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- **`"):
            items.append(line[2:].strip())
        elif items and line.startswith("  ") and line.strip():
            items[-1] += " " + line.strip()
        elif not line.strip():
            items.append("") if items and items[-1] else None
    rows = {}
    for item in filter(None, items):
        name = re.match(r"\*\*`(\w+)`\*\*", item)
        fields = {f.split("*:", 1)[0].strip("* "): f.split("*:", 1)[1] for f in item.split(" · ")[1:] if "*:" in f}
        to_pass = next(v for k, v in fields.items() if k.startswith("what to pass"))
        given = next(v for k, v in fields.items() if k.startswith("transduce's mask for a given"))
        rows[name[1]] = (re.findall(r"`([^`]+)`", to_pass), re.findall(r"`([^`]+)`", given))
    return rows


TABLE = doc_table()


def evaluate(expr: str, batch: dict, **names):
    scope = dict(
        torch=torch,
        nn=nn,
        causal_mask=causal_mask,
        padding_mask=padding_mask,
        pad=PAD,
        B=B,
        S=S,
        T=T,
        h=H,
        **batch,
        **names,
    )
    return eval(expr, {"__builtins__": {"float": float}}, scope)  # noqa: S307 - the docs' own code


def passes(arg: str, batch: dict) -> list:
    """Every value the table says to pass as `arg` for transduce's masks."""
    exprs = TABLE[arg][0]
    assert exprs, f"docs/paper_map.md: nothing to pass as {arg}"
    return [evaluate(e, batch) for e in exprs]


def meaning(arg: str, batch: dict, a: torch.Tensor) -> torch.Tensor:
    """The transduce mask the table says the nn argument `a` (bool, True = blocked) means."""
    (expr,) = TABLE[arg][1]
    return evaluate(expr, batch, a=a)


def as_float(b: torch.Tensor) -> torch.Tensor:
    """A bool nn mask in float form (the docs' conversion)."""
    return torch.zeros(b.shape).masked_fill(b, float("-inf"))


def like(kpm: torch.Tensor, attn_mask) -> torch.Tensor:
    """A bool key padding mask in the type of the attention mask it goes with."""
    return as_float(kpm) if attn_mask is not None and attn_mask.is_floating_point() else kpm


# ---------------------------------------------------------------------------------------------
# A padded batch, modules with the same weights
# ---------------------------------------------------------------------------------------------


def tokens(lengths: list[int], width: int, gen: torch.Generator) -> torch.Tensor:
    t = torch.randint(1, 20, (len(lengths), width), generator=gen)
    for row, n in enumerate(lengths):
        t[row, n:] = PAD
    return t


@pytest.fixture()
def batch() -> dict:
    gen = torch.Generator().manual_seed(0)
    src, tgt = tokens(SRC_LENGTHS, S, gen), tokens(TGT_LENGTHS, T, gen)
    src_mask, tgt_mask = make_masks(src, tgt, PAD)
    return dict(
        src=src,
        tgt=tgt,
        src_mask=src_mask,
        tgt_mask=tgt_mask,
        x=torch.randn(B, S, E, generator=gen),
        y=torch.randn(B, T, E, generator=gen),
    )


def randomize(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 1.0 if ".norm" in f".{name}" and name.endswith("weight") else 0.0  # LayerNorm gains near 1
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + scale)
    return module.eval()


def config(n_layers: int = 1) -> ModelConfig:
    return ModelConfig(
        src_vocab_size=20,
        n_layers=n_layers,
        d_model=E,
        n_heads=H,
        d_ff=FF,
        dropout=0.0,
        attention_dropout=0.0,
        attention_bias=True,
        layer_norm_eps=EPS,
        norm_first=False,
    )


def nn_state(ours: nn.Module) -> dict:
    state = {}
    for key, value in ours.state_dict().items():
        for a, b in NN_NAMES:
            key = key.replace(a, b)
        state[key] = value
    return state


def nn_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    theirs = nn.MultiheadAttention(E, H, dropout=0.0, bias=True, batch_first=True)
    theirs.load_state_dict(nn_state(ours))
    return theirs.eval()


def nn_layer(ours: nn.Module) -> nn.Module:
    kind = nn.TransformerEncoderLayer if isinstance(ours, EncoderLayer) else nn.TransformerDecoderLayer
    theirs = kind(E, H, FF, dropout=0.0, activation="relu", layer_norm_eps=EPS, batch_first=True, norm_first=False)
    theirs.load_state_dict(nn_state(ours))
    return theirs.eval()


def assert_same_on_real_positions(ours, theirs, tokens_q):
    real = tokens_q != PAD
    torch.testing.assert_close(theirs[real], ours[real], atol=ATOL, rtol=RTOL)


def differs_on_real_positions(ours, theirs, tokens_q) -> bool:
    real = tokens_q != PAD
    return not torch.allclose(theirs[real], ours[real], atol=1e-3, rtol=1e-3)


def allowed_somewhere(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A random (rows, cols) bool nn mask, True = blocked, that leaves key 0 and the diagonal open
    (key 0 is a real token in every sentence, so no row is all blocked)."""
    a = torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < 0.5
    a[:, 0] = False
    a.diagonal().fill_(False)
    return a


# ---------------------------------------------------------------------------------------------
# The docs' table covers exactly nn.Transformer's mask arguments
# ---------------------------------------------------------------------------------------------


def test_table_has_a_row_for_every_mask_argument_of_nn_transformer():
    params = set(inspect.signature(nn.Transformer.forward).parameters) - {"self", "src", "tgt"}
    assert params == {
        "src_mask",
        "tgt_mask",
        "memory_mask",
        "src_key_padding_mask",
        "tgt_key_padding_mask",
        "memory_key_padding_mask",
        "src_is_causal",
        "tgt_is_causal",
        "memory_is_causal",
    }
    assert set(TABLE) == params
    for flag in ["src_is_causal", "tgt_is_causal", "memory_is_causal"]:
        assert TABLE[flag][0] in (["True"], ["False"]) and not TABLE[flag][1], flag


def test_the_padding_masks_the_table_gives_are_transduce_masks_inverted(batch):
    for arg, key in [
        ("src_key_padding_mask", "src"),
        ("memory_key_padding_mask", "src"),
        ("tgt_key_padding_mask", "tgt"),
    ]:
        for value in passes(arg, batch):
            assert value.dtype == torch.bool and torch.equal(value, batch[key] == PAD), arg
    kpm = batch["src"] == PAD
    assert torch.equal(meaning("src_key_padding_mask", batch, kpm), batch["src_mask"])
    assert torch.equal(meaning("memory_key_padding_mask", batch, kpm), batch["src_mask"])
    assert torch.equal(meaning("tgt_key_padding_mask", batch, batch["tgt"] == PAD), batch["tgt_mask"])
    # The float form of a bool mask, and back.
    assert torch.equal(as_float(kpm).isneginf(), kpm)
    assert torch.equal(nn.Transformer.generate_square_subsequent_mask(T).isneginf(), ~causal_mask(T)[0, 0])


# ---------------------------------------------------------------------------------------------
# Attention: transduce.MultiHeadAttention against nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------


def test_encoder_self_attention_src_mask_is_src_key_padding_mask(batch):
    ours = randomize(MultiHeadAttention(E, H, E // H, E // H, bias=True), 1)
    theirs, x = nn_mha(ours), batch["x"]
    expected, _ = ours(x, mask=batch["src_mask"])
    for kpm in passes("src_key_padding_mask", batch):
        for k in (kpm, as_float(kpm)):  # bool, then float
            out, _ = theirs(x, x, x, key_padding_mask=k, need_weights=False)
            assert_same_on_real_positions(expected, out, batch["src"])
    # All of src_mask as one (N*h, S, S) attn_mask, no key padding mask.
    (none, whole) = passes("src_mask", batch)
    assert none is None
    out, _ = theirs(x, x, x, attn_mask=whole, need_weights=False)
    assert_same_on_real_positions(expected, out, batch["src"])


def test_decoder_self_attention_tgt_mask_is_inverted_causal_plus_tgt_key_padding_mask(batch):
    ours = randomize(MultiHeadAttention(E, H, E // H, E // H, bias=True), 2)
    theirs, y = nn_mha(ours), batch["y"]
    expected, _ = ours(y, mask=batch["tgt_mask"])
    kpm = passes("tgt_key_padding_mask", batch)[0]
    bool_causal, float_causal, whole = passes("tgt_mask", batch)
    assert bool_causal.shape == float_causal.shape == (T, T) and whole.shape == (B * H, T, T)
    assert bool_causal.dtype == torch.bool and float_causal.is_floating_point()
    for attn_mask in (bool_causal, float_causal):
        for is_causal in (False, True):
            out, _ = theirs(
                y,
                y,
                y,
                attn_mask=attn_mask,
                key_padding_mask=like(kpm, attn_mask),
                need_weights=False,
                is_causal=is_causal,
            )
            assert_same_on_real_positions(expected, out, batch["tgt"])
    out, _ = theirs(y, y, y, attn_mask=whole, need_weights=False)
    assert_same_on_real_positions(expected, out, batch["tgt"])
    # And back: a (N*h, T, T) bool nn mask is the transduce mask ~a.view(B, h, T, T).
    ours_from_whole, _ = ours(y, mask=~whole.view(B, H, T, T))
    torch.testing.assert_close(ours_from_whole, expected)


def test_cross_attention_src_mask_is_memory_key_padding_mask(batch):
    ours = randomize(MultiHeadAttention(E, H, E // H, E // H, bias=True), 3)
    theirs, x, y = nn_mha(ours), batch["x"], batch["y"]
    expected, _ = ours(y, memory=x, mask=batch["src_mask"])
    assert passes("memory_mask", batch) == [None]
    for kpm in passes("memory_key_padding_mask", batch):
        for k in (kpm, as_float(kpm)):
            out, _ = theirs(y, x, x, key_padding_mask=k, need_weights=False)
            assert_same_on_real_positions(expected, out, batch["tgt"])


def test_memory_mask_is_a_per_query_restriction_of_the_cross_attention_mask(batch):
    ours = randomize(MultiHeadAttention(E, H, E // H, E // H, bias=True), 4)
    theirs, x, y = nn_mha(ours), batch["x"], batch["y"]
    a = allowed_somewhere(T, S, seed=5)  # nn's memory_mask, True = blocked
    mask = meaning("memory_mask", batch, a)
    assert mask.shape == (B, 1, T, S)
    expected, _ = ours(y, memory=x, mask=mask)
    kpm = batch["src"] == PAD
    for attn_mask, k in ((a, kpm), (as_float(a), as_float(kpm))):
        out, _ = theirs(y, x, x, attn_mask=attn_mask, key_padding_mask=k, need_weights=False)
        assert_same_on_real_positions(expected, out, batch["tgt"])
    unrestricted, _ = ours(y, memory=x, mask=batch["src_mask"])
    assert differs_on_real_positions(unrestricted, expected, batch["tgt"])  # the restriction matters


def test_causal_mask_itself_as_nn_attn_mask_is_the_inversion_trap(batch):
    """The old docs mapped tgt_mask to causal_mask(T): in nn's polarity that blocks exactly the
    keys transduce allows (and every key of the last query, which becomes NaN)."""
    ours = randomize(MultiHeadAttention(E, H, E // H, E // H, bias=True), 6)
    theirs, y = nn_mha(ours), batch["y"]
    expected, _ = ours(y, mask=batch["tgt_mask"])
    out, _ = theirs(y, y, y, attn_mask=causal_mask(T)[0, 0], key_padding_mask=batch["tgt"] == PAD, need_weights=False)
    assert differs_on_real_positions(expected, out, batch["tgt"])


# ---------------------------------------------------------------------------------------------
# Layers: transduce.EncoderLayer / DecoderLayer against nn.TransformerEncoderLayer / DecoderLayer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "no_grad-fastpath"])
def test_encoder_layer(batch, grad):
    ours = randomize(EncoderLayer(config()), 7)
    theirs, x, src = nn_layer(ours), batch["x"], batch["src"]
    with torch.set_grad_enabled(grad):
        expected, _ = ours(x, batch["src_mask"])
        none, whole = passes("src_mask", batch)
        (is_causal,) = passes("src_is_causal", batch)
        for kpm in passes("src_key_padding_mask", batch):
            out = theirs(x, src_mask=none, src_key_padding_mask=kpm, is_causal=is_causal)
            assert_same_on_real_positions(expected, out, src)
        assert_same_on_real_positions(expected, theirs(x, src_mask=whole), src)

        # A given nn src_mask `a`, with the key padding mask: transduce's src_mask & ~a.
        kpm = src == PAD
        for a in (allowed_somewhere(S, S, seed=8), ~causal_mask(S)[0, 0]):
            expected, _ = ours(x, meaning("src_mask", batch, a))
            for attn_mask in (a, as_float(a)):
                out = theirs(x, src_mask=attn_mask, src_key_padding_mask=like(kpm, attn_mask))
                assert_same_on_real_positions(expected, out, src)
        # src_is_causal=True is a hint about a causal src_mask (a is the causal one here).
        out = theirs(x, src_mask=a, src_key_padding_mask=kpm, is_causal=True)
        assert_same_on_real_positions(expected, out, src)


@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "no_grad-fastpath"])
def test_decoder_layer(batch, grad):
    ours = randomize(DecoderLayer(config()), 9)
    theirs, x, y, tgt = nn_layer(ours), batch["x"], batch["y"], batch["tgt"]
    with torch.set_grad_enabled(grad):
        expected, _, _ = ours(y, x, batch["tgt_mask"], batch["src_mask"])
        tgt_kpm = passes("tgt_key_padding_mask", batch)[0]
        (mem_none,) = passes("memory_mask", batch)
        (tgt_is_causal,) = passes("tgt_is_causal", batch)
        (memory_is_causal,) = passes("memory_is_causal", batch)
        bool_causal, float_causal, whole = passes("tgt_mask", batch)
        for mem_kpm in passes("memory_key_padding_mask", batch):
            for tgt_mask in (bool_causal, float_causal):
                for flag in (False, tgt_is_causal):
                    out = theirs(
                        y,
                        x,
                        tgt_mask=tgt_mask,
                        memory_mask=mem_none,
                        tgt_key_padding_mask=like(tgt_kpm, tgt_mask),
                        memory_key_padding_mask=like(mem_kpm, tgt_mask),
                        tgt_is_causal=flag,
                        memory_is_causal=memory_is_causal,
                    )
                    assert_same_on_real_positions(expected, out, tgt)
            out = theirs(y, x, tgt_mask=whole, memory_key_padding_mask=mem_kpm)
            assert_same_on_real_positions(expected, out, tgt)

        # Given nn masks `a`, with the key padding masks: transduce's masks from the table.
        src_kpm = batch["src"] == PAD
        a_tgt, a_mem = allowed_somewhere(T, T, seed=10), allowed_somewhere(T, S, seed=11)
        expected, _, _ = ours(y, x, meaning("tgt_mask", batch, a_tgt), meaning("memory_mask", batch, a_mem))
        for f in (lambda m: m, as_float):  # bool, then float
            out = theirs(
                y,
                x,
                tgt_mask=f(a_tgt),
                memory_mask=f(a_mem),
                tgt_key_padding_mask=f(tgt_kpm),
                memory_key_padding_mask=f(src_kpm),
            )
            assert_same_on_real_positions(expected, out, tgt)


def test_decoder_layer_with_causal_mask_itself_is_the_inversion_trap(batch):
    ours = randomize(DecoderLayer(config()), 12)
    theirs, x, y, tgt = nn_layer(ours), batch["x"], batch["y"], batch["tgt"]
    expected, _, _ = ours(y, x, batch["tgt_mask"], batch["src_mask"])
    out = theirs(
        y,
        x,
        tgt_mask=causal_mask(T)[0, 0],
        tgt_key_padding_mask=tgt == PAD,
        memory_key_padding_mask=batch["src"] == PAD,
    )
    assert differs_on_real_positions(expected, out, tgt)


# ---------------------------------------------------------------------------------------------
# The whole nn.Transformer.forward, every argument as the table says
# ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # torch's own fast path
@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "no_grad-fastpath"])
@pytest.mark.parametrize("form", ["bool", "float"])
def test_nn_transformer_forward_with_every_mask_argument(batch, grad, form):
    c = config(n_layers=2)
    enc = [randomize(EncoderLayer(c), 20 + i) for i in range(c.n_layers)]
    dec = [randomize(DecoderLayer(c), 30 + i) for i in range(c.n_layers)]
    # nn.Transformer's stacks end in a LayerNorm; transduce's post-norm stacks do not (norm=None).
    encoder = nn.TransformerEncoder(nn_layer(enc[0]), c.n_layers, norm=None)
    decoder = nn.TransformerDecoder(nn_layer(dec[0]), c.n_layers, norm=None)
    model = nn.Transformer(
        E,
        H,
        c.n_layers,
        c.n_layers,
        FF,
        dropout=0.0,
        custom_encoder=encoder,
        custom_decoder=decoder,
        layer_norm_eps=EPS,
        batch_first=True,
    ).eval()
    # After construction: nn.Transformer re-initializes its (custom) stacks' parameters.
    for ours, theirs in zip(enc + dec, list(model.encoder.layers) + list(model.decoder.layers)):
        theirs.load_state_dict(nn_state(ours))

    x, y = batch["x"], batch["y"]
    memory = x
    for layer in enc:
        memory, _ = layer(memory, batch["src_mask"])
    expected = y
    for layer in dec:
        expected, _, _ = layer(expected, memory, batch["tgt_mask"], batch["src_mask"])

    kw = {arg: passes(arg, batch)[0] for arg in TABLE}  # the first form of each row
    kw["tgt_mask"] = passes("tgt_mask", batch)[1] if form == "float" else kw["tgt_mask"]
    assert kw["src_mask"] is None and kw["memory_mask"] is None
    for arg in ("src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"):
        kw[arg] = like(kw[arg], kw["tgt_mask"])
    with torch.set_grad_enabled(grad):
        out = model(x, y, **kw)
    assert_same_on_real_positions(expected, out, batch["tgt"])
