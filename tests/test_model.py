"""Section 3 behaviour, pinned: attention paths, masks, cached decoding, embeddings, positions."""

import math

import pytest
import torch

from transduce.config import ModelConfig
from transduce.masks import causal_mask, make_masks
from transduce.model import MultiHeadAttention, Transformer, attention_reference, count_parameters
from transduce.positions import sinusoidal_positions
import torch.nn.functional as F

PAD = 0


def tiny_config(**kw) -> ModelConfig:
    base = dict(src_vocab_size=50, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


def padded_batch(lengths, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    return x


# -- attention -------------------------------------------------------------------------------


@pytest.mark.parametrize("masked", ["none", "padding", "causal", "both"])
@pytest.mark.parametrize("dk,dv", [(8, 8), (16, 4)])
def test_sdpa_fast_path_matches_reference(masked, dk, dv):
    """The fused kernel and the written-out equation 1 agree in fp32."""
    torch.manual_seed(0)
    B, h, T = 3, 4, 7
    q, k, v = torch.randn(B, h, T, dk), torch.randn(B, h, T, dk), torch.randn(B, h, T, dv)
    tokens = padded_batch([7, 4, 1])
    mask = {
        "none": None,
        "padding": make_masks(tokens, None, PAD)[0],
        "causal": causal_mask(T),
        "both": make_masks(tokens, tokens, PAD)[1],
    }[masked]
    ref, weights = attention_reference(q, k, v, mask)
    fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, h, T))
    if mask is not None:  # masked positions get exactly zero weight
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_reference_is_equation_1():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 3, 5), torch.randn(1, 1, 4, 5), torch.randn(1, 1, 4, 2)
    out, w = attention_reference(q, k, v)
    expected_w = torch.softmax(q[0, 0] @ k[0, 0].T / math.sqrt(5), dim=-1)
    torch.testing.assert_close(w[0, 0], expected_w)
    torch.testing.assert_close(out[0, 0], expected_w @ v[0, 0])


@pytest.mark.parametrize("dk,dv", [(8, 8), (16, 4)])
def test_multihead_fast_and_reference_paths_agree(dk, dv):
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=32, n_heads=4, d_k=dk, d_v=dv).eval()
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    src = padded_batch([6, 3])
    mask = make_masks(src, None, PAD)[0]
    for memory in (None, mem):
        m = None if memory is None else mask
        fast, none = mha(x, memory, m)
        ref, w = mha(x, memory, m, need_weights=True)
        assert none is None and w.shape == (2, 4, 5, 5 if memory is None else 6)
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    # d_k, d_v independent of d_model / h: projection shapes follow them.
    assert mha.in_proj.weight.shape == (4 * (2 * dk + dv), 32)
    assert mha.out_proj.weight.shape == (32, 4 * dv)


# -- masks -----------------------------------------------------------------------------------


def test_make_masks_convention():
    src = torch.tensor([[5, 6, 3], [7, 3, PAD]])
    tgt = torch.tensor([[2, 5, 6], [2, 8, PAD]])
    src_mask, tgt_mask = make_masks(src, tgt, PAD)
    assert src_mask.dtype == torch.bool and src_mask.shape == (2, 1, 1, 3)
    assert src_mask[1, 0, 0].tolist() == [True, True, False]
    assert tgt_mask.shape == (2, 1, 3, 3)
    assert tgt_mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # the padded key position is hidden from every query
    assert tgt_mask[1, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def test_causal_mask_with_offset():
    m = causal_mask(2, 5)[0, 0]
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_padding_does_not_leak():
    """Changing what stands in padded positions changes no real position's logits."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src, tgt = padded_batch([6, 3], seed=1), padded_batch([5, 2], seed=2)
    out = model(src, tgt)
    src2, tgt2 = src.clone(), tgt.clone()
    src2[1, 3:], tgt2[1, 2:] = 9, 9  # garbage instead of padding...
    src_mask, tgt_mask = make_masks(src, tgt, PAD)  # ...but the masks of the padded batch
    memory, _ = model.encoder(src2, src_mask)
    x, _, _ = model.decoder(tgt2, memory, src_mask, tgt_mask)
    torch.testing.assert_close(model.logits(x)[1, :2], out[1, :2], rtol=1e-5, atol=1e-5)


# -- incremental decoding ----------------------------------------------------------------------


@pytest.fixture(params=["sdpa", "step_attention"])
def step_attention(request, monkeypatch):
    """Decoding steps attend through `attention.step_attention` (the model's: on the CPU the
    decoding form `attention.decode_attention`), or, for comparison, PyTorch's fused kernel."""
    import torch.nn.functional as F

    if request.param == "sdpa":
        monkeypatch.setattr(
            "transduce.model.step_attention",
            lambda q, k, v, mask=None, keys_first=False: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        )
    return request.param


def with_step_attention(model, form):
    """`model`, whose steps attend as the `step_attention` fixture set (`form`: its name)."""
    return model


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_decoding_equals_full_forward(norm_first, positional, step_attention):
    """Step-by-step decoding with the cache gives the logits of one full pass, batch with padding."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(norm_first=norm_first, positional=positional, d_k=6, d_v=10)).eval()
    with_step_attention(model, step_attention)
    src = padded_batch([7, 3, 5], seed=3)
    tgt = padded_batch([6, 6, 6], seed=4)
    full = model(src, tgt)
    src_mask, _ = make_masks(src, None, PAD)
    cache = model.init_cache(model.encode(src, src_mask), src_mask)
    steps = [model.decode_step(tgt[:, t : t + 1], cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 6


def test_cached_decoding_multi_token_chunks_and_reorder(step_attention):
    torch.manual_seed(0)
    model = with_step_attention(Transformer(tiny_config()).eval(), step_attention)
    src, tgt = padded_batch([7, 3], seed=5), padded_batch([6, 6], seed=6)
    full = model(src, tgt)
    src_mask, _ = make_masks(src, None, PAD)
    cache = model.init_cache(model.encode(src, src_mask), src_mask)
    first = model.decode_step(tgt[:, :4], cache)  # a prefix of 4 at once
    torch.testing.assert_close(first, full[:, :4], rtol=1e-5, atol=1e-5)
    # reorder: swap rows and duplicate row 0 (what beam search does)
    index = torch.tensor([1, 0, 0])
    cache.reorder(index)
    rest = model.decode_step(tgt[index, 4:5], cache)
    torch.testing.assert_close(rest, full[index, 4:5], rtol=1e-5, atol=1e-5)
    # two reorders before the next step compose (the cache applies them lazily, in one copy)
    cache.reorder(torch.tensor([2, 0, 1, 1]))
    cache.reorder(torch.tensor([3, 1, 0]))
    index = index[torch.tensor([2, 0, 1, 1])][torch.tensor([3, 1, 0])]
    rest = model.decode_step(tgt[index, 5:], cache)
    torch.testing.assert_close(rest, full[index, 5:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_cache_reuses_one_spare_buffer_and_stays_exact(mode, step_attention):
    """After its first steps the cache writes each layer's keys into the buffer the layer before
    let go of, instead of allocating new memory every step: its layers hold n_layers + 1 buffers,
    not two each (inference mode sets no `_base` on views: the buffers are tracked explicitly),
    and decoding with reorders still matches the full forward pass."""
    torch.manual_seed(0)
    model = with_step_attention(Transformer(tiny_config()).eval(), step_attention)
    src, tgt = padded_batch([7, 3], seed=5), padded_batch([9, 9], seed=6)
    index = torch.tensor([1, 0])  # swap the rows before every step
    with mode():
        src_mask, _ = make_masks(src, None, PAD)
        cache = model.init_cache(model.encode(src, src_mask), src_mask)
        rows, ptrs, steps = torch.arange(2), [], []
        for t in range(tgt.size(1)):
            steps.append(model.decode_step(tgt[rows, t : t + 1], cache))
            ptrs.append({layer.self_k.untyped_storage().data_ptr() for layer in cache.layers})
            cache.reorder(index)
            rows = rows[index]
        full = model(src, tgt)
    n = len(cache.layers)
    assert all(len(p) == n for p in ptrs) and len(set().union(*ptrs[3:])) == n + 1
    expected = [full[[0, 1] if t % 2 == 0 else [1, 0], t] for t in range(9)]  # rows swap every step
    for t in range(9):
        torch.testing.assert_close(steps[t][:, 0], expected[t], rtol=1e-5, atol=1e-5)


# -- embeddings and positions ----------------------------------------------------------------


def test_shared_embeddings_are_one_matrix():
    model = Transformer(tiny_config())
    assert model.encoder.embed is model.decoder.embed
    assert model.output_proj is None
    names = [n for n, _ in model.named_parameters() if "embed" in n]
    assert names == ["encoder.embed.weight"]  # one matrix, three uses (3.4)
    # pre-softmax projection uses the unscaled matrix
    x = torch.randn(1, 1, 32)
    torch.testing.assert_close(model.logits(x), x @ model.encoder.embed.weight.T)


def test_embeddings_scaled_by_sqrt_d_model():
    model = Transformer(tiny_config())
    tok = torch.tensor([[5]])
    torch.testing.assert_close(model.encoder.embed(tok)[0, 0], model.encoder.embed.weight[5] * math.sqrt(32))


def test_separate_vocabularies():
    c = tiny_config(src_vocab_size=40, tgt_vocab_size=30, share_embeddings=False)
    model = Transformer(c)
    assert model.encoder.embed is not model.decoder.embed
    out = model(padded_batch([4], vocab=40), padded_batch([3], vocab=30))
    assert out.shape == (1, 3, 30)
    untied = Transformer(tiny_config(src_vocab_size=40, tgt_vocab_size=30, share_embeddings=False, tie_output=False))
    assert untied.output_proj is not None
    with pytest.raises(ValueError, match="share_embeddings"):
        ModelConfig(src_vocab_size=40, tgt_vocab_size=30)


def test_sinusoids_match_section_3_5():
    pe = sinusoidal_positions(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    torch.testing.assert_close(sinusoidal_positions(5, 16, offset=45), pe[45:])


def test_sinusoids_extend_beyond_table_and_learned_positions_refuse():
    model = Transformer(tiny_config(max_positions=8)).eval()
    table = model.encoder.positions.table
    assert model(padded_batch([20]), padded_batch([12])).shape == (1, 12, 50)
    # forward never changes the module: the buffer is the same tensor, 8 rows (DDP may sync it)
    assert model.encoder.positions.table is table and table.shape[0] == 8
    assert torch.equal(model.decoder.positions(6, offset=5), sinusoidal_positions(11, 32)[5:])
    learned = Transformer(tiny_config(max_positions=8, positional="learned")).eval()
    with pytest.raises(ValueError, match="max_positions"):
        learned(padded_batch([20]), padded_batch([3]))


def test_return_attention_weights():
    model = Transformer(tiny_config()).eval()
    src, tgt = padded_batch([5, 3]), padded_batch([4, 4])
    logits, attn = model(src, tgt, return_attention=True)
    torch.testing.assert_close(logits, model(src, tgt), rtol=1e-5, atol=1e-5)
    assert len(attn["encoder"]) == 2 and attn["encoder"][0].shape == (2, 4, 5, 5)
    assert attn["decoder_cross"][1].shape == (2, 4, 4, 5)
    assert attn["decoder_cross"][0][1, :, :, 3:].abs().sum() == 0  # source padding gets no weight
    assert attn["decoder_self"][0][0, 0].triu(1).abs().sum() == 0  # no attention to the future


# -- sub-layer structure -----------------------------------------------------------------------


def test_post_norm_is_default_and_layer_output_is_normalised():
    c = tiny_config()
    assert c.norm_first is False
    model = Transformer(c).eval()
    layer = model.encoder.layers[0]
    x = torch.randn(2, 5, 32)
    y, _ = layer(x, None)
    # LayerNorm(x + Sublayer(x)) with fresh LN params: zero mean, unit variance per position
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    assert model.encoder.final_norm is None
    assert Transformer(tiny_config(norm_first=True)).encoder.final_norm is not None


def test_dropout_active_only_in_training():
    model = Transformer(tiny_config(dropout=0.3, attention_dropout=0.2))
    src, tgt = padded_batch([5]), padded_batch([4])
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))


def test_beams_folded_into_cross_attention_equal_copied_sources(step_attention):
    """repeat_rows(k) keeps one source row per sentence and folds the k beams into the query
    dimension of encoder-decoder attention; it must decode exactly like copying the source k
    times, also after reordering within sentences and after a sentence leaves the batch."""
    torch.manual_seed(0)
    model = with_step_attention(Transformer(tiny_config()).eval(), step_attention)
    src = padded_batch([7, 3, 5], seed=7)
    src_mask, _ = make_masks(src, None, PAD)
    memory = model.encode(src, src_mask)
    folded, copied = model.init_cache(memory, src_mask), model.init_cache(memory, src_mask)
    k = 2
    folded.repeat_rows(k)
    copied.reorder(torch.arange(3).repeat_interleave(k))
    assert folded.batch_size == copied.batch_size == 6 and folded.layers[0].cross_k.size(0) == 3
    tgt = padded_batch([5] * 6, seed=8)
    for t in range(2):
        torch.testing.assert_close(
            model.decode_step(tgt[:, t : t + 1], folded),
            model.decode_step(tgt[:, t : t + 1], copied),
            rtol=1e-5,
            atol=1e-5,
        )
    within = torch.tensor([1, 1, 3, 2, 4, 5])  # beams move within their sentence
    folded.reorder(within, same_sources=True)
    copied.reorder(within, same_sources=True)
    drop = torch.tensor([0, 1, 5, 4])  # sentence 1 leaves
    folded.reorder(drop)
    copied.reorder(drop)
    for t in range(2, 5):
        torch.testing.assert_close(
            model.decode_step(tgt[:4, t : t + 1], folded),
            model.decode_step(tgt[:4, t : t + 1], copied),
            rtol=1e-5,
            atol=1e-5,
        )
    with pytest.raises(ValueError, match="single source"):
        folded.reorder(torch.tensor([0, 2, 1, 3]))


def test_attention_has_no_biases_unless_asked():
    """3.2.2: the projections W^Q, W^K, W^V, W^O are matrices; biases are an option."""
    c = ModelConfig(src_vocab_size=50, n_layers=1, d_model=16, d_ff=32, n_heads=2)
    model = Transformer(c)
    names = [n for n, _ in model.named_parameters() if "attn" in n]
    assert names and not any(n.endswith("bias") for n in names)
    biased = Transformer(
        ModelConfig(src_vocab_size=50, n_layers=1, d_model=16, d_ff=32, n_heads=2, attention_bias=True)
    )
    extra = count_parameters(biased) - count_parameters(model)
    assert extra == 3 * (3 * 16 + 16)  # three attentions, each [b^Q; b^K; b^V] and b^O
    mha = MultiHeadAttention(16, 2, 8, 8)
    assert mha.in_proj.bias is None and mha.out_proj.bias is None
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            mha(x)[0],
            mha.out_proj(F.scaled_dot_product_attention(*mha.project_qkv(x)).transpose(1, 2).reshape(2, 5, 16)),
        )
