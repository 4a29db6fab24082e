"""Decoding (Section 6.1): the searches (`search`: greedy and beam, through the model's cache,
`transduce.cache`), the engines that run a search on a batch (transduce's own, CTranslate2's),
streaming text through them, and loading a model ready to decode (`ready`)."""
