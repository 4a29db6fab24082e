"""English constituency parsing as sequence-to-sequence (Section 6.3 of the paper, Table 4).

Only what is specific to trees lives here: trees and their linearization, EVALB, Penn Treebank
tokenization, constrained search, parsing and scoring; the rest is the translation pipeline.
"""
