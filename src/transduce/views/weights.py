"""The attention weights of a teacher-forced pass, as tensors and as JSON (docs/attention.md): for
each of the three uses of attention (3.2.3), every layer's and head's weights and the masks the
model applied. The decoder inputs are BOS and the target: position i predicts `predicts[i]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..defaults import ALPHA, ATTENTION_MAX_TOKENS, ATTENTION_TYPES, BEAM, MAX_LEN_OFFSET
from ..masks import make_masks
from ..restricted import within_window
from ..data.batching import pad_batch

TYPES = ATTENTION_TYPES  # the three uses of attention (3.2.3)

TYPE_NAMES = {
    "encoder": "encoder self-attention",
    "decoder_self": "decoder self-attention (masked)",
    "decoder_cross": "encoder-decoder attention",
}

DECIMALS = 4  # Weights in the JSON and the page are rounded to this many decimals

FORMAT = "transduce-attention/1"


def readable(piece: str) -> str:
    """A subword piece as a label: "▁mak" -> "mak", "ing" -> "·ing", "<unk>" as is, a bare "▁" -> "␣"."""
    if piece.startswith("<") and piece.endswith(">"):
        return piece
    if piece.startswith("\u2581"):
        return piece[1:] or "\u2423"
    return "\u00b7" + piece


@dataclass
class AttentionBatch:
    """A padded batch and the attention weights the model computed on it."""

    src: Tensor  # (B, S) source ids, EOS-terminated, right-padded with PAD
    tgt: Tensor  # (B, T) decoder inputs (BOS + target), right-padded with PAD
    weights: dict[str, list[Tensor]]  # Per type, one (B, h, Tq, Tk) tensor per layer, float32 on the CPU
    masks: dict[str, Tensor]  # per type, the mask applied (True = may attend), (B, Tq, Tk): all heads alike
    src_lengths: list[int]
    tgt_lengths: list[int]
    notes: list[list[str]] = field(default_factory=list)  # per sentence, what the user should know
    attention_window: int | None = None  # the model's restricted self-attention r; None: full

    @property
    def n_layers(self) -> int:
        return len(self.weights["encoder"])

    @property
    def n_heads(self) -> int:
        return self.weights["encoder"][0].size(1)

    def sentence(self, i: int, kind: str) -> Tensor:
        """Sentence i's weights of one type, cut to its real tokens: (L, h, Tq, Tk)."""
        q = self.src_lengths[i] if kind == "encoder" else self.tgt_lengths[i]
        k = self.tgt_lengths[i] if kind == "decoder_self" else self.src_lengths[i]
        return torch.stack([w[i, :, :q, :k] for w in self.weights[kind]])


@torch.no_grad()
def compute_attention(model, sources: list[list[int]], targets: list[list[int]]) -> AttentionBatch:
    """Teacher-force `targets` (subword ids, no BOS/EOS) given `sources` (no EOS) through `model`
    in one padded batch and return every attention weight (fp32, eval mode)."""
    if len(sources) != len(targets) or not sources:
        raise ValueError("give one target per source sentence")
    ids = model.config.special_ids
    pad = ids.pad
    src = pad_batch([s + [ids.eos] for s in sources], pad)
    tgt = pad_batch([[ids.bos] + t for t in targets], pad)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        _, attention = model(src.to(device), tgt.to(device), return_attention=True)
    finally:
        model.train(was_training)
    src_mask, tgt_mask = make_masks(src, tgt, pad)  # (B, 1, 1, S), (B, 1, T, T): what forward built
    B, S, T = src.size(0), src.size(1), tgt.size(1)
    r = model.config.attention_window  # Table 1's restricted self-attention (None: the paper's full)
    masks = {
        "encoder": within_window(src_mask, r, S, S)[:, 0].expand(B, S, S),
        "decoder_self": within_window(tgt_mask, r, T, T)[:, 0].expand(B, T, T),
        "decoder_cross": src_mask[:, 0].expand(B, T, S),
    }
    weights = {kind: [w.float().cpu() for w in attention[kind]] for kind in TYPES}
    return AttentionBatch(
        src, tgt, weights, masks, [len(s) + 1 for s in sources], [len(t) + 1 for t in targets], [[] for _ in sources], r
    )


def _rounded(t: Tensor):
    """Nested lists of numbers rounded to DECIMALS; exact zeros (and what rounds to zero) as 0."""
    scale = 10**DECIMALS
    ints = torch.round(t.double() * scale).long()

    def conv(x):
        if isinstance(x, list):
            return [conv(y) for y in x]
        return x / scale if x else 0

    return conv(ints.tolist())


def to_json(batch: AttentionBatch, src_vocab, tgt_vocab, *, model: str = "", texts: list[dict] | None = None) -> dict:
    """The batch as a JSON-able dict (see the module docstring); `texts[i]` adds sentence i's
    texts ({"source": ..., "target": ..., "target_from": ...})."""

    def pieces(vocab, ids):
        return [vocab.sp.id_to_piece(int(i)) for i in ids]

    sentences = []
    for i in range(batch.src.size(0)):
        s_ids = batch.src[i, : batch.src_lengths[i]].tolist()
        t_ids = batch.tgt[i, : batch.tgt_lengths[i]].tolist()
        src_p, tgt_p = pieces(src_vocab, s_ids), pieces(tgt_vocab, t_ids)
        predicts = tgt_p[1:] + [tgt_vocab.sp.id_to_piece(tgt_vocab.eos)]
        entry = dict(texts[i]) if texts else {}
        entry.update(
            {
                "source": [readable(p) for p in src_p],
                "source_pieces": src_p,
                "target": [readable(p) for p in tgt_p],
                "target_pieces": tgt_p,
                "predicts": [readable(p) for p in predicts],
                "notes": batch.notes[i] if batch.notes else [],
                "attention": {kind: _rounded(batch.sentence(i, kind)) for kind in TYPES},
            }
        )
        sentences.append(entry)
    return {
        "format": FORMAT,
        "model": model,
        "n_layers": batch.n_layers,
        "n_heads": batch.n_heads,
        "types": list(TYPES),
        "type_names": TYPE_NAMES,
        "decimals": DECIMALS,
        "attention_window": batch.attention_window,
        "layout": "attention[type][layer][head][query][key], layers and heads from 0 (the page and the "
        "figures number them from 1); source = subword pieces + </s>; target = decoder inputs "
        "(<s> + target), position i predicting predicts[i]",
        "sentences": sentences,
        "batch": {
            "source": [pieces(src_vocab, row) for row in batch.src.tolist()],
            "target": [pieces(tgt_vocab, row) for row in batch.tgt.tolist()],
            "source_lengths": batch.src_lengths,
            "target_lengths": batch.tgt_lengths,
            "masks": {kind: batch.masks[kind].int().tolist() for kind in TYPES},
            "masks_layout": "masks[type][sentence][query][key]: 1 = may attend, 0 = blocked; the same for "
            "every layer and head (transduce.masks.make_masks)",
        },
    }


MAX_SENTENCES = 8  # Sentences in one batch (one page) at most
MAX_WEIGHTS = 4_000_000  # weights in one page at most (about 25 MB of text)


def attention_data(
    loaded,
    sources: list[str],
    targets: list[str | None] | None = None,
    *,
    beam: int = BEAM,
    alpha: float = ALPHA,
    greedy: bool = False,
    max_len_offset: int = MAX_LEN_OFFSET,
    max_tokens: int = ATTENTION_MAX_TOKENS,
) -> tuple[AttentionBatch, dict]:
    """Weights and JSON for `sources` with their `targets` (None: the model's own translation, as
    `transduce translate` decodes) from a `transduce.decoding.ready.LoadedModel`: what `transduce attention` does."""
    from ..decoding.translate import translate_stream

    targets = list(targets) if targets is not None else [None] * len(sources)
    if not sources:
        raise ValueError("no sentence given")
    if len(sources) > MAX_SENTENCES:
        raise ValueError(f"{len(sources)} sentences: at most {MAX_SENTENCES} in one view (make several)")
    if len(targets) != len(sources):
        raise ValueError(f"{len(targets)} targets for {len(sources)} sentences: give one per sentence, or none")
    if max_tokens < 1:
        raise ValueError("the token cap must be at least 1")
    src_ids, tgt_ids, texts, notes = [], [], [], []
    own = [i for i, t in enumerate(targets) if t is None]
    translations = {}
    if own:
        stream = translate_stream(
            loaded.model,
            loaded.src_vocab,
            loaded.tgt_vocab,
            [sources[i] for i in own],
            beam=beam,
            alpha=alpha,
            greedy=greedy,
            max_len_offset=max_len_offset,
            max_input_tokens=max_tokens,
            warn=lambda m: None,
        )
        translations = dict(zip(own, (cands[0] for cands in stream)))
    how = "the model's greedy translation" if greedy else f"the model's translation (beam {beam}, alpha {alpha})"
    for i, (source, target) in enumerate(zip(sources, targets)):
        if not source.strip():
            raise ValueError(f"sentence {i + 1} is empty")
        if target is None:
            t_ids, t_text, t_from = translations[i].tokens, translations[i].text, how
        else:
            t_ids, t_text, t_from = loaded.tgt_vocab.encode(target), target, "given"
        note = []
        for side, ids, out in (("source", loaded.src_vocab.encode(source), src_ids), ("target", t_ids, tgt_ids)):
            if len(ids) > max_tokens:
                note.append(
                    f"{side} cut to its first {max_tokens} of {len(ids)} subword tokens (the cap, --keep-tokens)"
                )
            out.append(ids[:max_tokens])
        texts.append({"source_text": source, "target_text": t_text, "target_from": t_from})
        notes.append(note)
    mc = loaded.config.model
    lengths = [(len(a) + 1, len(b) + 1) for a, b in zip(src_ids, tgt_ids)]  # with </s>, with <s>
    n = mc.n_layers * mc.n_heads * sum(S * S + T * T + T * S for S, T in lengths)
    if n > MAX_WEIGHTS:
        raise ValueError(
            f"{n:,} weights would be more than a page should hold ({MAX_WEIGHTS:,}): give fewer or "
            "shorter sentences, or a lower --keep-tokens"
        )
    batch = compute_attention(loaded.model, src_ids, tgt_ids)
    batch.notes = notes
    data = to_json(batch, loaded.src_vocab, loaded.tgt_vocab, model=loaded.description, texts=texts)
    data["max_tokens"] = max_tokens
    return batch, data


def find_token(labels: list[str], pieces: list[str], spec: str, side: str) -> int:
    """The position (from 0) that `spec` names among a sentence's tokens: a number (from 1), a
    token as labelled ("making", "·ing") when it occurs once, or a word split into pieces (its
    first piece). Repeated tokens are told apart by position: the error lists them."""
    spec = spec.strip()
    if spec.isdigit():
        pos = int(spec)
        if not 1 <= pos <= len(labels):
            raise ValueError(f"--query {pos}: the {side} has positions 1 to {len(labels)}")
        return pos - 1
    hits = [i for i, t in enumerate(labels) if t == spec]
    if not hits:  # a word made of several pieces: its first piece
        starts = [i for i, p in enumerate(pieces) if p.startswith(("\u2581", "<"))] + [len(pieces)]
        for a, b in zip(starts, starts[1:]):
            if "".join(pieces[a:b]).lstrip("\u2581") == spec:
                hits.append(a)
    if len(hits) == 1:
        return hits[0]
    listing = " ".join(f"{i + 1}:{t}" for i, t in enumerate(labels))
    if not hits:
        raise ValueError(f"--query {spec!r} is not a token of the {side} ({listing}): give a position or a token")
    raise ValueError(
        f"--query {spec!r} occurs at positions {', '.join(str(i + 1) for i in hits)} of the {side}: give the position"
    )
