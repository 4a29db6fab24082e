"""The special ids, the same in every vocabulary (`transduce.data.vocab`) and in every model
(`ModelConfig.pad_id`): PAD = 0 (padding), UNK = 1, BOS = 2 (the first decoder input), EOS = 3
(stored after every sentence, the last decoder output)."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
