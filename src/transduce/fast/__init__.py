"""Speed-ups that compute what `transduce.model` computes, with less overhead, applied to a built
model from the outside (its modules: docs/architecture.md)."""
