"""A trained model in the engines other stacks run: CTranslate2 (`ct2`) and Hugging Face's
MarianMT (`marian`), each exact (tested: the same log-probabilities within float tolerance, the
same greedy outputs), and a MarianMT directory read back (`marian.import_marian`, bitwise).

The traps each engine sets, and what they mean for results, are in docs/export.md.
"""
