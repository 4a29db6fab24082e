"""The special ids belong to the model's config and its vocabulary (`transduce.special_ids`): a model or
data directory that records none has the default layout and decodes to the same bytes; a model of
another layout decodes and trains as the same model renumbered, so every path reads the ids from
the config (masks, the loss's ignore index, batching's padding, both searches)."""

import json

import numpy as np
import pytest
import torch

from tiny_models import SRC_WORDS, make_model, sentences

from transduce.checkpoint.files import CHECKSUMS, CONFIG, WEIGHTS, digests
from transduce.config import Config, ModelConfig
from transduce.data.batching import collate, data_special_ids
from transduce.decoding.ready import load_translation_model
from transduce.decoding.search import beam_search, greedy_decode
from transduce.decoding.translate import translate_lines
from transduce.model import Transformer
from transduce.special_ids import DEFAULT, SpecialIds
from transduce.train.step import train_step

pytestmark = pytest.mark.usefixtures("one_thread")


def test_what_records_no_ids_has_the_default_layout():
    model = ModelConfig(src_vocab_size=50).__dict__
    written_before = {k: v for k, v in model.items() if k not in ("unk_id", "bos_id", "eos_id")}
    assert Config.from_dict({"model": written_before}).model.special_ids == DEFAULT == SpecialIds(0, 1, 2, 3)
    assert data_special_ids({"format": 1}) == DEFAULT
    assert data_special_ids({"special_ids": {"pad": 9, "unk": 1, "bos": 9, "eos": 0}}) == SpecialIds(9, 1, 9, 0)
    with pytest.raises(ValueError, match="eos_id 0 must differ from pad_id and bos_id"):
        ModelConfig(src_vocab_size=50, pad_id=0, eos_id=0)
    with pytest.raises(ValueError, match="special ids .* must be ids of both vocabularies"):
        ModelConfig(src_vocab_size=50, pad_id=50)


def test_a_model_directory_written_before_decodes_to_the_same_bytes(tmp_path):
    """A model directory whose config.json has pad_id alone (as written before the ids were
    fields) translates, greedy and beam, to the bytes the same model with the ids written does."""
    d = make_model(tmp_path / "m")
    before = tmp_path / "before"
    before.mkdir()
    for f in d.iterdir():
        (before / f.name).write_bytes(f.read_bytes())
    config = json.loads((before / CONFIG).read_text())
    assert config["model"]["eos_id"] == 3
    for k in ("unk_id", "bos_id", "eos_id"):
        del config["model"][k]
    (before / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    (before / CHECKSUMS).write_text(json.dumps(digests(before, (WEIGHTS, CONFIG)), indent=2) + "\n")
    lines = sentences(SRC_WORDS, 12, seed=7)
    out = []
    for path in (d, before):
        m = load_translation_model(path)
        assert m.config.model.special_ids == DEFAULT
        out.append(
            [
                translate_lines(m.model, m.src_vocab, m.tgt_vocab, lines, beam=4, max_len_offset=10),
                translate_lines(m.model, m.src_vocab, m.tgt_vocab, lines, greedy=True, max_len_offset=10),
            ]
        )
    assert out[0] == out[1] and any(out[0][0])


V = 40
LAYOUT = SpecialIds(pad=V - 1, unk=5, bos=17, eos=0)
"""Another layout: EOS 0 and PAD last as OPUS-MT's, the start token elsewhere."""


def _renumbering() -> torch.Tensor:
    """pi: the default layout's id -> LAYOUT's id, a bijection of [0, V)."""
    pi = [None] * V
    for name in ("pad", "unk", "bos", "eos"):
        pi[getattr(DEFAULT, name)] = getattr(LAYOUT, name)
    rest = iter(i for i in range(V) if i not in LAYOUT.to_dict().values())
    return torch.tensor([p if p is not None else next(rest) for p in pi])


def _twins():
    """A model of the default layout and the same model renumbered to LAYOUT (rows of the shared
    embedding moved), and pi."""
    torch.manual_seed(0)
    c = dict(src_vocab_size=V, n_layers=2, d_model=32, d_ff=64, n_heads=4, dropout=0.0)
    a = Transformer(ModelConfig(**c)).eval()
    b = Transformer(ModelConfig(**c, **{f"{k}_id": v for k, v in LAYOUT.to_dict().items()})).eval()
    pi = _renumbering()
    state = a.state_dict()
    state["encoder.embed.weight"] = state["decoder.embed.weight"] = torch.empty_like(state["encoder.embed.weight"])
    state["encoder.embed.weight"][pi] = a.state_dict()["encoder.embed.weight"]
    b.load_state_dict(state)
    return a, b, pi


def _sources(pi=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(6, V, (n,), generator=g).tolist() + [DEFAULT.eos] for n in (7, 3, 5, 1)]
    if pi is not None:
        rows = [pi[torch.tensor(r)].tolist() for r in rows]
    pad = DEFAULT.pad if pi is None else LAYOUT.pad
    return torch.tensor([r + [pad] * (8 - len(r)) for r in rows])


def test_another_layout_decodes_as_the_same_model_renumbered():
    """Greedy and beam search, reading PAD, BOS and EOS from the model's config: the outputs of the
    renumbered model are the renumbered outputs (and the scores the same)."""
    a, b, pi = _twins()
    greedy_a, greedy_b = (
        greedy_decode(a, _sources(), max_len_offset=6),
        greedy_decode(b, _sources(pi), max_len_offset=6),
    )
    assert [pi[torch.tensor(o, dtype=torch.long)].tolist() for o in greedy_a] == greedy_b
    beams_a = beam_search(a, _sources(), beam_size=4, alpha=0.6, max_len_offset=6, n_best=3)
    beams_b = beam_search(b, _sources(pi), beam_size=4, alpha=0.6, max_len_offset=6, n_best=3)
    for ha, hb in zip(beams_a, beams_b):
        assert [pi[torch.tensor(h.tokens, dtype=torch.long)].tolist() for h in ha] == [h.tokens for h in hb]
        assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-5)
    assert any(len(o) > 1 for o in greedy_a)


def test_another_layout_trains_as_the_same_model_renumbered():
    """One step of training: batches padded with the data's PAD and started with its BOS
    (`collate`), the loss ignoring the model's PAD and smoothing over all but its PAD and BOS: the
    same loss, and the same weights after the step, renumbered."""
    a, b, pi = _twins()
    g = np.random.default_rng(1)
    pairs = [(g.integers(6, V, n), g.integers(6, V, m)) for n, m in ((5, 4), (2, 6), (7, 1))]
    batch_a = collate([np.r_[s, DEFAULT.eos] for s, _ in pairs], [np.r_[t, DEFAULT.eos] for _, t in pairs])
    pin = pi.numpy()
    batch_b = collate(
        [pin[np.r_[s, DEFAULT.eos]] for s, _ in pairs],
        [pin[np.r_[t, DEFAULT.eos]] for _, t in pairs],
        LAYOUT.pad,
        LAYOUT.bos,
    )
    assert batch_b["tgt_in"][0, 0] == LAYOUT.bos and (batch_b["src"] == LAYOUT.pad).any()
    sums = []
    for model, batch in ((a, batch_a), (b, batch_b)):
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sums.append(train_step(model, opt, [batch], lr=1e-2, label_smoothing=0.1).sums)
    torch.testing.assert_close(sums[0], sums[1])
    torch.testing.assert_close(b.encoder.embed.weight.detach()[pi], a.encoder.embed.weight.detach())
    torch.testing.assert_close(b.decoder.layers[0].feed_forward.w_1.weight, a.decoder.layers[0].feed_forward.w_1.weight)
