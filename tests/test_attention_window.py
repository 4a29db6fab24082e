"""Restricted self-attention (Section 4, Table 1's fourth row; `ModelConfig.attention_window`, off
by default): each query sees the keys within r positions, in the decoder only the r before it and
itself; encoder-decoder attention stays full. The window is part of the one mask convention, so
the teacher-forced pass, the cached decoding steps (the plain and the `transduce.fast.decode` attention)
and the attention weights all apply it; the exports that cannot represent it refuse."""

import pytest
import torch

from transduce.checkpoint import load_model, save_model
from transduce.cli import main
from transduce.config import Config, ModelConfig, apply_overrides, get_preset
from transduce.data.vocab import BOS, EOS, PAD
from transduce.decoding.search import beam_search, greedy_decode
from transduce.model import Transformer
from transduce.decoding.ready import make_ready
from transduce.restricted import window_mask, within_window

from tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

V = 24


def model(window: int | None, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(
        ModelConfig(src_vocab_size=V, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0, attention_window=window)
    )
    with torch.no_grad():  # sharper distributions than the initialisation gives
        m.decoder.embed.weight.mul_(3.0)
    return m.eval()


def batch(seed: int = 1, B: int = 3, S: int = 13, T: int = 11, src_lengths=(13, 9, 4), tgt_lengths=(11, 6, 3)):
    """Right-padded random sources (EOS-terminated) and decoder inputs (BOS first)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((B, S), PAD, dtype=torch.long)
    tgt = torch.full((B, T), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        src[i, :s] = torch.randint(4, V, (s,), generator=g)
        src[i, s - 1] = EOS
        tgt[i, :t] = torch.randint(4, V, (t,), generator=g)
        tgt[i, 0] = BOS
    return src, tgt, list(src_lengths), list(tgt_lengths)


def test_the_masks():
    assert window_mask(4, window=1)[0, 0].int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    # a step at position t = 5 (5 cached keys) with r = 2 sees keys 3, 4, 5
    assert window_mask(1, 6, window=2)[0, 0].int().tolist() == [[0, 0, 0, 1, 1, 1]]
    assert within_window(None, None, 3, 3) is None
    # a padding query whose window holds only padding keys keeps its row of the padding mask
    pad = torch.tensor([[True, True, False, False, False, False]])[:, None, None, :]
    m = within_window(pad, 1, 6, 6)[0, 0]
    assert m[0].tolist() == [True, True, False, False, False, False]  # real query: its window
    assert m[5].tolist() == [True, True, False, False, False, False]  # padding query, window empty: full row


@pytest.mark.parametrize("r", [12, 13, 100])
def test_a_window_as_wide_as_the_sequences_is_full_attention(r):
    """r >= n - 1 (S = 13, T = 11): every key within reach, the same logits as the paper's attention (fp32)."""
    src, tgt, _, _ = batch()
    full, windowed = model(None), model(r)
    assert windowed.config.attention_window == r
    torch.testing.assert_close(windowed(src, tgt), full(src, tgt), rtol=1e-5, atol=1e-5)


def test_a_narrow_window_changes_the_output():
    src, tgt, _, _ = batch()
    assert not torch.allclose(model(2)(src, tgt), model(None)(src, tgt), atol=1e-3)


@pytest.mark.parametrize("r", [0, 1, 3])
def test_no_weight_outside_the_window(r):
    src, tgt, src_len, tgt_len = batch()
    with torch.no_grad():
        _, att = model(r)(src, tgt, return_attention=True)
    cross_beyond = 0.0
    for b, (S, T) in enumerate(zip(src_len, tgt_len)):  # real queries and keys of each sentence
        i = torch.arange(16)[:, None]
        j = torch.arange(16)[None, :]
        for layer in range(2):
            enc = att["encoder"][layer][b, :, :S, :S]
            assert (enc[:, ((i - j).abs() > r)[:S, :S]] == 0).all()  # exact zeros
            assert torch.allclose(enc.sum(-1), torch.ones(4, S))
            dec = att["decoder_self"][layer][b, :, :T, :T]
            assert (dec[:, ((j > i) | (j < i - r))[:T, :T]] == 0).all()
            assert (dec[:, ((j <= i) & (j >= i - r))[:T, :T]] > 0).all()  # inside: every key weighs
            cross = att["decoder_cross"][layer][b, :, :T, :S]  # encoder-decoder attention: full
            cross_beyond = max(cross_beyond, float(cross[:, ((i - j).abs() > r)[:T, :S]].sum()))
    assert cross_beyond > 0.1


def teacher_forced_logprobs(m, src, tokens):
    """log P of `tokens` (no BOS, EOS last) under the full forward pass."""
    tgt_in = torch.tensor([[BOS] + tokens[:-1]])
    lp = m(src, tgt_in).log_softmax(-1)[0]
    return float(lp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


@pytest.mark.parametrize("fast", [False, True], ids=["sdpa", "kernels"])
@pytest.mark.parametrize("r", [1, 3])
def test_cached_decoding_equals_the_full_pass(r, fast):
    """The cache holds every earlier key; the window must reach into it: the step at position t
    sees keys max(0, t - r) .. t. One step at a time, several at a time, greedy and beam search
    (through the beam's reorders) against the full forward pass."""
    m = model(r)
    undo = make_ready(m) if fast else (lambda: None)
    try:
        src, tgt, _, _ = batch(B=1, S=9, T=12, src_lengths=(9,), tgt_lengths=(12,))
        with torch.no_grad():
            full = m(src, tgt)
            cache = m.init_cache(m.encode(src), src != PAD)
            cache.src_mask = cache.src_mask[:, None, None, :]
            steps = [m.decode_step(tgt[:, t : t + 1], cache) for t in range(5)]  # one at a time
            steps.append(m.decode_step(tgt[:, 5:9], cache))  # four at once, on top of the cache
            steps += [m.decode_step(tgt[:, t : t + 1], cache) for t in range(9, 12)]
            torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)

            # greedy: the same tokens as re-running the full pass on the prefix at every step
            out, prefix = greedy_decode(m, src, max_len_offset=6)[0], [BOS]
            for _ in range(len(out) + 1):
                nxt = m(src, torch.tensor([prefix]))[0, -1]
                nxt[[PAD, BOS]] = float("-inf")
                prefix.append(int(nxt.argmax()))
            assert out == prefix[1 : len(out) + 1]
            assert len(out) == 9 + 6 or prefix[-1] == EOS  # the maximum length, or EOS came next

            # beam search: every hypothesis's log-probability is the full pass's
            hyps = beam_search(m, src, beam_size=3, n_best=3, max_len_offset=6)[0]
            for h in hyps:
                assert abs(h.logprob - teacher_forced_logprobs(m, src, h.tokens + [EOS])) < 1e-3
    finally:
        undo()


def test_off_by_default_and_round_trips_through_a_saved_model(tmp_path):
    assert ModelConfig().attention_window is None and get_preset("base").model.attention_window is None
    c = apply_overrides(get_preset("small"), ["model.attention_window=5"])
    assert c.model.attention_window == 5
    assert Config.from_dict(c.to_dict()).model.attention_window == 5
    m = model(4)
    save_model(m, Config(model=m.config), tmp_path / "m")
    loaded, config = load_model(tmp_path / "m")
    assert config.model.attention_window == 4 and loaded.config.attention_window == 4
    src, tgt, _, _ = batch()
    assert torch.equal(loaded.eval()(src, tgt), m(src, tgt))
    for bad in (-1, 2.5, True, "7"):
        with pytest.raises(ValueError, match="attention_window"):
            ModelConfig(attention_window=bad)


@pytest.mark.parametrize("fmt", ["ct2", "marian"])
def test_exports_refuse_a_window_in_one_line(tmp_path, capsys, fmt):
    model_dir = make_model(tmp_path / "m", attention_window=3)
    assert main(["export", fmt, str(model_dir), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("transduce export: error: ") and err.count("\n") == 1 and "attention_window" in err
    assert not (tmp_path / "out").exists()


def test_the_attention_views_show_the_window(tmp_path):
    """`transduce attention` on a windowed model: zero weight outside the window, the JSON's masks
    and the figures mark those cells as blocked by the window, and the page draws them so."""
    from browser import launch, sync_playwright
    from transduce.decoding.ready import load_translation_model
    from transduce.views import figures
    from transduce.views.weights import compute_attention, to_json

    r = 2
    model_dir = make_model(tmp_path / "m", attention_window=r)
    loaded = load_translation_model(model_dir)
    v = loaded.src_vocab
    sources = [v.encode("a dog runs on the grass with a red ball"), v.encode("two children play")]
    targets = [v.encode("two children play with a dog on the grass"), v.encode("a dog")]
    data = to_json(compute_attention(loaded.model, sources, targets), v, v)
    assert data["attention_window"] == r
    blocked = 0
    for kind in ("encoder", "decoder_self"):
        for s, sentence in enumerate(data["sentences"]):
            w = torch.tensor(sentence["attention"][kind])  # (L, h, q, k), real tokens
            mask = torch.tensor(data["batch"]["masks"][kind][s])
            cats, q_pad = figures.mask_categories(data, s, kind)
            for i in range(w.size(2)):
                for j in range(w.size(3)):
                    if abs(i - j) > r:
                        assert (w[:, :, i, j] == 0).all() and mask[i, j] == 0
                        assert cats[i][j] in ("window", "causal")
                        blocked += cats[i][j] == "window"
    assert blocked > 50
    assert all(c != "window" for row in figures.mask_categories(data, 0, "decoder_cross")[0] for c in row)
    hatched = figures.heatmap_figure(data, kind="encoder", layer=0, sentence=0)
    assert hatched != figures.heatmap_figure({**data, "attention_window": None}, kind="encoder", layer=0, sentence=0)
    assert figures.masks_figure(data, sentences=[1]).startswith(b"\x89PNG")

    html = tmp_path / "a.html"
    args = [
        "attention",
        str(model_dir),
        "a dog runs on the grass with a red ball",
        "--target-text",
        "two children play",
        "--html",
        str(html),
    ]
    assert main(args) == 0
    with sync_playwright() as p:
        b = launch(p)
        try:
            page = b.new_page()
            page.goto(html.as_uri())
            page.select_option("#view-kind", value="heatmap")
            outside = page.eval_on_selector_all(
                "#view svg.heatmap[data-h='0'] rect.cell[data-outside]",
                "rs => rs.map(r => [+r.dataset.q, +r.dataset.k, +r.dataset.w])",
            )
            assert outside and all(abs(i - j) > r and w == 0 for i, j, w in outside)
            page.select_option("#view-kind", value="masks")
            cats = page.eval_on_selector_all(
                "#masks rect.mask", "rs => rs.map(r => [+r.dataset.q, +r.dataset.k, r.dataset.cat])"
            )
            assert {(i, j) for i, j, c in cats if c == "window"} == {(i, j) for i, j, c in cats if abs(i - j) > r}
            assert "outside the window (r = 2)" in page.inner_text("#view")
        finally:
            b.close()
