"""English constituency parsing as sequence-to-sequence (Section 6.3 of the paper, Table 4).

What is specific to trees lives here; everything else is the one pipeline
(prepare -> train -> average -> decode -> score):

    trees.py      bracketed trees in (one per line, or PTB .mrg multi-line), the clean-up of raw
                  .mrg trees, Vinyals et al.'s linearization, and the way back: an output
                  sequence repaired into a well-formed tree over exactly the input words
    evalb.py      EVALB with COLLINS.prm, count for count the C program
    tokenize.py   raw English -> Penn Treebank tokens (for `transduce parse`)
    constrain.py  optional: beam search that can only produce well-formed trees (not in the paper)
    parse.py      words -> trees with a trained model; scoring a treebank split (`transduce
                  evaluate`), the SVG picture of a tree
"""
