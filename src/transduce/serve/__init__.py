"""`transduce serve`: a trained model behind an HTTP JSON API (FastAPI on uvicorn), its requests
batched dynamically by one decoding thread. `app` is the API (schemas, limits, errors),
`batcher` the batching; `transduce.memory` keeps the process's memory bounded.

Importing this package bounds oneDNN's per-shape kernel caches for the process
(`transduce.memory.bound_kernel_caches`: `TRANSDUCE_KERNEL_CACHE` shapes), which takes effect when
it comes before the process's first product, as in `transduce serve`."""

from ..memory import bound_kernel_caches as _bound_kernel_caches

_bound_kernel_caches()
