"""`transduce serve`: a trained model behind an HTTP JSON API (FastAPI on uvicorn), its requests
batched dynamically by one decoding thread. `app` is the API (schemas, limits, errors),
`batcher` the batching."""
