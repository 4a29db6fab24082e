"""Attention views: what the model attends to (the paper's appendix, Figures 3-5).

* `weights`: the weights of a teacher-forced pass (`Transformer.forward(return_attention=True)`)
  on a padded batch, with the masks applied, and their JSON;
* `figures`: PNG figures with matplotlib (the paper's lines, heatmaps, the masks);
* `page`: one self-contained interactive HTML page that works offline.

The command is `transduce attention` (`transduce.cli.attention`); docs/attention.md shows it on
the main job's model, docs/masks.md explains the masks.
"""
