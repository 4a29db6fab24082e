"""Speed-ups that compute what `transduce.model` computes, with less overhead, applied to a built
model from the outside: `decode` (packed weights, decoding attention; `transduce.ready.make_ready` applies them), `step` (the
decoder's step as one function), `int8` (int8 decoding), `train` (training's dropout and bf16
attention); `ops` holds every private PyTorch operator they call."""
