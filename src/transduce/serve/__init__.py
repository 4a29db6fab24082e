"""`transduce serve`: a trained model behind an HTTP JSON API (FastAPI on uvicorn), its requests
batched dynamically by one decoding thread. Importing it bounds oneDNN's kernel caches
(`transduce.memory.bound_kernel_caches`), before the process's first product."""

from ..memory import bound_kernel_caches as _bound_kernel_caches

_bound_kernel_caches()
