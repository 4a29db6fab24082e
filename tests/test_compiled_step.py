"""benchmarks/compiled_step.py compares like with like: its one-function decoder step (what it
compiles) gives the logits of `Transformer.decode_step` for the same cache, beam reorder included."""

import sys
from pathlib import Path

import torch

from transduce.config import get_preset
from transduce.model import Transformer, padding_mask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from compiled_step import Step  # noqa: E402


def test_step_function_matches_decode_step():
    c = get_preset("small").model
    c.n_layers, c.src_vocab_size = 2, 50
    torch.manual_seed(0)
    model = Transformer(c).eval()
    B, k, S = 3, 4, 7
    src = torch.randint(4, 50, (B, S))
    src[1, 5:] = c.pad_id  # a padded source: the mask matters
    with torch.no_grad():
        src_mask = padding_mask(src, c.pad_id)
        cache = model.init_cache(model.encode(src, src_mask), src_mask)
        model.decode_step(torch.full((B, 1), 2), cache)
        cache.repeat_rows(k)
        for _ in range(3):
            model.decode_step(torch.randint(4, 50, (B * k, 1)), cache)
        rows = torch.tensor([1, 1, 0, 3, 4, 6, 7, 5, 11, 8, 8, 9])  # within each sentence's beams
        cache.reorder(rows, same_sources=True)
        tok = torch.randint(4, 50, (B * k,))
        args = (tok, model.decoder.positions(1, offset=cache.length)[0], cache.pending,
                [layer.self_k for layer in cache.layers], [layer.self_v for layer in cache.layers],
                [layer.cross_k for layer in cache.layers], [layer.cross_v for layer in cache.layers],
                torch.zeros(src_mask.shape).masked_fill(~src_mask, float("-inf")))
        logits, new_k, _ = Step(model)(*args)
        expected = model.decode_step(tok[:, None], cache)[:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_k[0], cache.layers[0].self_k)
