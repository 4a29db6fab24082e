"""Attention views: what the model attends to (the paper's appendix, Figures 3-5): `weights`
(the weights of a teacher-forced pass and their JSON), `figures` (PNG figures) and `page` (one
self-contained HTML page that works offline). The command is `transduce attention`; docs/attention.md.
"""
