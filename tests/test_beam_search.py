"""Beam search correctness (Section 6.1): exhaustive equality, a scripted-probability model with
hand-computed hypotheses and scores, batch == one-by-one, and exact early termination."""

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from transduce.config import ModelConfig
from transduce.decoding.ranking import CPU_CHUNK_ELEMENTS, _best_extensions, search_chunk_elements
from transduce.decoding.search import beam_search, greedy_decode, length_penalty
from transduce.model import Transformer

PAD, BOS, EOS, A, B = 0, 2, 3, 4, 5


def test_length_penalty_is_gnmt_not_length_power():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)  # ((5+1)/6)^a
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(10, 0.0) == 1.0


# -- a scripted-probability model ------------------------------------------------------------


class ScriptCache:
    def __init__(self, n):
        self.prefixes = [[] for _ in range(n)]

    def reorder(self, index, same_sources=False):
        self.prefixes = [list(self.prefixes[i]) for i in index.tolist()]

    def repeat_rows(self, k):
        self.reorder(torch.arange(len(self.prefixes)).repeat_interleave(k))


class ScriptedModel:
    """Next-token probabilities looked up by the output prefix (BOS excluded); a prefix not in
    the script ends with EOS for sure. Counts decoding steps."""

    config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)

    def __init__(self, script, vocab=6):
        self.script, self.vocab, self.steps = script, vocab, 0

    def encode(self, src, src_mask):
        return src

    def init_cache(self, memory, src_mask):
        return ScriptCache(memory.size(0))

    def decode_step(self, tokens, cache):
        self.steps += 1
        logits = torch.full((tokens.size(0), 1, self.vocab), float("-inf"))
        for row, tok in enumerate(tokens[:, 0].tolist()):
            if tok != BOS:
                cache.prefixes[row].append(tok)
            for t, p in self.script.get(tuple(cache.prefixes[row]), {EOS: 1.0}).items():
                logits[row, 0, t] = math.log(p)
        return logits


# P(a)=.6, P(b)=.4; after a: EOS .7, b .3; after b: a 1; after ab / ba: EOS 1.
SCRIPT = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.7, B: 0.3}, (B,): {A: 1.0}}
SRC = torch.tensor([[7, 8, EOS]])  # length 3 -> max output length 53


def lp(n, alpha):
    return ((5 + n) / 6) ** alpha


@pytest.mark.parametrize("beam", [2, 4])
def test_scripted_length_penalty_changes_the_winner(beam):
    # alpha = 0: "a" (P = .42) beats "b a" (P = .4).
    out = beam_search(ScriptedModel(SCRIPT), SRC, beam_size=beam, alpha=0.0, n_best=2)[0]
    assert [h.tokens for h in out] == [[A], [B, A]]
    assert out[0].score == pytest.approx(math.log(0.42))
    assert out[1].score == pytest.approx(math.log(0.4))
    # alpha = 0.6: lp(2) = (7/6)^.6, lp(3) = (8/6)^.6 and "b a" wins.
    out = beam_search(ScriptedModel(SCRIPT), SRC, beam_size=beam, alpha=0.6, n_best=2)[0]
    assert [h.tokens for h in out] == [[B, A], [A]]
    assert out[0].score == pytest.approx(math.log(0.4) / lp(3, 0.6))
    assert out[1].score == pytest.approx(math.log(0.42) / lp(2, 0.6))
    assert out[0].logprob == pytest.approx(math.log(0.4))


def test_scripted_beam4_nbest_and_beam1_misses():
    out = beam_search(ScriptedModel(SCRIPT), SRC, beam_size=4, alpha=0.6, n_best=3)[0]
    assert [h.tokens for h in out] == [[B, A], [A], [A, B]]
    assert out[2].score == pytest.approx(math.log(0.18) / lp(3, 0.6))
    # beam 1 follows "a" (P .6) and never sees "b a"
    out = beam_search(ScriptedModel(SCRIPT), SRC, beam_size=1, alpha=0.6)[0]
    assert [h.tokens for h in out] == [[A]]


def test_scripted_max_length_and_early_stop():
    loop = {(): {A: 0.9, EOS: 0.1}}  # "a" forever is likelier, but only EOS may end it
    for n in range(1, 10):
        loop[(A,) * n] = {A: 0.9, EOS: 0.1}
    model = ScriptedModel(loop)
    out = beam_search(model, torch.tensor([[EOS]]), beam_size=2, alpha=0.0, max_len_offset=3)[0]
    # max length 1 + 3 = 4 tokens including EOS: "a a a EOS" is forced at the end
    assert [h.tokens for h in out] == [[A, A, A]] or out[0].tokens in ([], [A], [A, A], [A, A, A])
    assert model.steps == 4
    assert all(len(h.tokens) <= 3 for h in out)
    # a script whose live hypotheses fall far behind the finished ones stops early
    sharp = {(): {EOS: 0.99, A: 0.01}, (A,): {A: 0.5, EOS: 0.5}}
    sharp.update({(A,) * n: {A: 0.5, EOS: 0.5} for n in range(2, 60)})
    model = ScriptedModel(sharp)
    out = beam_search(model, SRC, beam_size=1, alpha=0.0)[0]
    assert out[0].tokens == [] and model.steps < 10


# -- a tiny random model ---------------------------------------------------------------------


def tiny_model(vocab=7, seed=0):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(src_vocab_size=vocab, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0))
    with torch.no_grad():  # sharper distributions than the initialisation gives
        model.encoder.embed.weight.mul_(4.0)
    return model.eval()


def exhaustive(model, src, max_len, alpha, n):
    """Score every output Y (tokens then EOS, |Y| <= max_len) exactly; return the n best."""
    V = model.config.src_vocab_size
    others = [t for t in range(V) if t not in (PAD, BOS, EOS)]  # search never emits PAD/BOS
    scored = []
    for m in range(max_len):
        for body in itertools.product(others, repeat=m):
            tgt_in = torch.tensor([[BOS, *body]])
            lprobs = model(src, tgt_in).log_softmax(-1)[0]
            out = [*body, EOS]
            logp = sum(lprobs[i, tok].item() for i, tok in enumerate(out))
            scored.append((logp / lp(m + 1, alpha), list(body)))
    scored.sort(key=lambda x: -x[0])
    return scored[:n]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_equals_exhaustive_search(alpha):
    model = tiny_model()
    src = torch.tensor([[5, EOS]])  # length 2, + offset 2 = at most 4 tokens with EOS
    best = exhaustive(model, src, max_len=4, alpha=alpha, n=5)
    out = beam_search(model, src, beam_size=4**3, alpha=alpha, max_len_offset=2, n_best=5)[0]
    assert [h.tokens for h in out] == [b for _, b in best]
    for h, (score, _) in zip(out, best):
        assert h.score == pytest.approx(score, abs=1e-5)
    assert all(PAD not in h.tokens and BOS not in h.tokens for h in out)


def test_early_stop_is_exact():
    model = tiny_model(vocab=12, seed=1)
    src = torch.tensor([[5, 6, 7, 8, 9, EOS], [4, 5, EOS, PAD, PAD, PAD]])
    for alpha in (0.0, 0.6):
        a = beam_search(model, src, beam_size=4, alpha=alpha, max_len_offset=10, n_best=4)
        b = beam_search(model, src, beam_size=4, alpha=alpha, max_len_offset=10, n_best=4, early_stop=False)
        assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]


def test_batch_equals_one_by_one():
    model = tiny_model(vocab=20, seed=2)
    g = torch.Generator().manual_seed(0)
    lengths = [9, 3, 6, 1, 7]
    src = torch.full((5, 10), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, 20, (n,), generator=g)
        src[i, n] = EOS
    batch = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=8, n_best=2)
    for i, n in enumerate(lengths):
        alone = beam_search(model, src[i : i + 1, : n + 1], beam_size=4, alpha=0.6, max_len_offset=8, n_best=2)[0]
        assert [h.tokens for h in batch[i]] == [h.tokens for h in alone]
        for x, y in zip(batch[i], alone):
            assert x.score == pytest.approx(y.score, abs=1e-5)
    greedy_batch = greedy_decode(model, src, max_len_offset=8)
    for i, n in enumerate(lengths):
        assert greedy_batch[i] == greedy_decode(model, src[i : i + 1, : n + 1], max_len_offset=8)[0]


def test_n_best_bounds():
    with pytest.raises(ValueError, match="n_best"):
        beam_search(tiny_model(), torch.tensor([[5, EOS]]), beam_size=2, n_best=3)


def _reference_extensions(logits, alive_lp, n, banned=(0, 2), eos_id=3, allowed=None, only_eos=None):
    """Every extension scored, then a full topk: what `_best_extensions` must equal."""
    b, r = alive_lp.shape
    lp = logits.float().log_softmax(-1)
    if allowed is not None:
        lp = lp.masked_fill(~allowed, float("-inf"))
    if only_eos is not None:
        rows = only_eos.repeat_interleave(r)
        keep = lp[rows, eos_id].clone()
        lp[rows] = float("-inf")
        lp[rows, eos_id] = keep
    lp[:, list(banned)] = float("-inf")
    return (lp.view(b, r, -1) + alive_lp[:, :, None]).view(b, -1)


def _check_extensions(logits, alive_lp, n, **kw):
    scores = _reference_extensions(logits, alive_lp, n, **{k: v for k, v in kw.items() if k != "chunk_elements"})
    values, hyp, token = _best_extensions(logits, alive_lp, n, [0, 2], 3, **kw)
    V = logits.size(-1)
    assert values.dtype == torch.float32
    assert torch.equal(values, scores.topk(n, dim=-1).values)  # exact in the scores
    assert torch.equal(scores.gather(1, hyp * V + token), values)  # the (hypothesis, token) pairs carry them
    pairs = (hyp * V + token).tolist()
    finite = torch.isfinite(values).tolist()
    assert all(len({p for p, f in zip(row, fin) if f}) == sum(fin) for row, fin in zip(pairs, finite))  # no pair twice
    assert not bool(((token == 0) | (token == 2))[torch.isfinite(values)].any())  # PAD and BOS never


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_best_extensions_equal_log_softmax_then_topk(dtype):
    """The search's candidates: log-softmax over all V in fp32, PAD/BOS then banned (not
    renormalised), plus each hypothesis's log-probability, the n best per sentence; in one chunk
    and in several, with a large V (block ranking) and a small one."""
    torch.manual_seed(0)
    for V in (3000, 37):
        logits = (torch.randn(12 * 4, V) * 4).to(dtype)
        alive = -torch.rand(12, 4) * 3
        for chunk in (1 << 20, 2 * 4 * V, 0):  # one chunk; chunks of two sentences; all at once (a GPU's)
            _check_extensions(logits, alive, 8, chunk_elements=chunk)
        _check_extensions(logits[:12], alive[:, :1], 8)  # step 0: one hypothesis per sentence


def test_search_chunks_on_the_cpu_only():
    """Chunks of log-probabilities are a CPU cache measure; on a GPU every sentence of a step is
    ranked at once (each chunk would cost kernel launches and a host synchronisation there), and
    the hypotheses are the same either way."""
    assert search_chunk_elements(torch.device("cpu")) == CPU_CHUNK_ELEMENTS
    assert search_chunk_elements(torch.device("cuda")) == 0
    torch.manual_seed(0)
    logits, alive = torch.randn(40 * 4, 37000) * 4, -torch.rand(40, 4) * 3
    chunked = _best_extensions(logits, alive, 8, [0, 2], 3)  # the CPU's default: 7 sentences a chunk
    whole = _best_extensions(logits, alive, 8, [0, 2], 3, chunk_elements=0)
    for a, b in zip(chunked, whole):
        assert torch.equal(a, b)


def test_projected_rows_rank_as_the_whole_logits():
    """A step's logits projected a part at a time (`ranking.ProjectedRows`, parts of 1-13 sentences'
    rows, each ranked as it is made) give the candidates of the whole logits ranked at once, where
    each row's logits depend on that row alone (here each row's index looks its logits up); PAD/BOS
    banned, the constraint's `allowed` and `only_eos` split with the rows."""
    from transduce.decoding.ranking import ProjectedRows

    torch.manual_seed(0)
    table, hidden = torch.randn(12 * 4, 3000) * 4, torch.arange(12 * 4)
    project = lambda rows: table[rows]  # noqa: E731
    alive = -torch.rand(12, 4) * 3
    allowed = torch.rand(12 * 4, 3000) > 0.1
    only_eos = torch.zeros(12, dtype=torch.bool)
    only_eos[[2, 7]] = True
    whole = _best_extensions(project(hidden), alive, 8, [0, 2], 3, allowed=allowed, only_eos=only_eos)
    for rows in (4, 8, 12, 32, 52):  # 1, 2, 3, 8 and 13 sentences a part (the last part shorter)
        parts = _best_extensions(
            ProjectedRows(project, hidden, rows), alive, 8, [0, 2], 3, allowed=allowed, only_eos=only_eos
        )
        for a, b in zip(parts, whole):
            assert torch.equal(a, b), rows
    step0 = _best_extensions(ProjectedRows(project, hidden[:12], 5), alive[:, :1], 8, [0, 2], 3)
    for a, b in zip(step0, _best_extensions(project(hidden[:12]), alive[:, :1], 8, [0, 2], 3)):
        assert torch.equal(a, b)


# -- block ranking at vocabulary sizes that are not multiples of the block (64) -----------------

# 37000 (the paper's) and 8001 leave a short last block; 257 / 513 / 1025 / 2049 are just above
# the size where the block path starts (4n blocks, n = 1, 2, 4, 8); 2111 leaves 63; 4096 is a
# multiple of 64 (control); 2047 takes the plain topk path for n = 8 with one hypothesis.
TOPK_VOCABS = [37000, 8001, 257, 513, 1025, 2049, 2111, 4096, 2047]


@pytest.mark.parametrize("V", TOPK_VOCABS)
@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("r", [1, 4])
def test_best_extensions_exact_and_distinct(V, n, r):
    g = torch.Generator().manual_seed(V * 10 + n)
    b = 3
    x = torch.randn(b * r, V, generator=g)
    alive = -torch.rand(b, r, generator=g) * 2
    _check_extensions(x, alive, n)  # random rows
    top = x.amax(-1, keepdim=True)
    last = x.clone()
    last[:, V - 1] = top[:, 0] + 1.0  # the best is the last column
    _check_extensions(last, alive, n)
    tail = x.clone()  # the top several values all in the last (possibly short) block
    width = min(V - (V // 64) * 64 or 64, n + 2)
    tail[:, V - width :] = top + torch.arange(width, 0, -1, dtype=x.dtype)
    _check_extensions(tail, alive, n)
    allowed = torch.ones_like(x, dtype=torch.bool)  # forbidden tokens (a constraint) do not come back
    allowed[:, : V // 2] = False
    _check_extensions(last, alive, n, allowed=allowed)
    if r > 1:
        dead = alive.clone()
        dead[:, 1:] = float("-inf")  # one live hypothesis per sentence: the others' extensions never win
        _check_extensions(x, dead, n)
    only_eos = torch.tensor([True] + [False] * (b - 1))
    _check_extensions(x, alive, n, only_eos=only_eos)  # at the maximum length only EOS may follow


class LastTokenBestModel:
    """Every step, the same distribution: the last token V-1 is the best, then EOS, then the
    rest in a fixed random order."""

    config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)

    def __init__(self, vocab):
        g = torch.Generator().manual_seed(vocab)
        self.logits = -20.0 - torch.rand(vocab, generator=g)
        self.logits[EOS], self.logits[vocab - 1] = -1.0, 0.0

    def encode(self, src, src_mask):
        return src

    def init_cache(self, memory, src_mask):
        return ScriptCache(memory.size(0))

    def decode_step(self, tokens, cache):
        return self.logits.expand(tokens.size(0), 1, -1).clone()


@pytest.mark.parametrize("V", [37000, 8001, 2111])
def test_beam_search_last_token_best_gives_distinct_hypotheses(V):
    src = torch.tensor([[7, 8, EOS], [9, EOS, PAD]])
    for hyps in beam_search(LastTokenBestModel(V), src, beam_size=4, alpha=0.6, max_len_offset=4, n_best=4):
        seqs = [tuple(h.tokens) for h in hyps]
        assert len(seqs) == 4 and len(set(seqs)) == 4, seqs  # pairwise distinct
        assert any(V - 1 in s for s in seqs)
        assert all(PAD not in s and BOS not in s for s in seqs)
