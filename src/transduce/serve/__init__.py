"""`transduce serve`: a trained model behind an HTTP JSON API (FastAPI on uvicorn), its requests
batched dynamically by one decoding thread. Importing it changes nothing; building the app
(`serve.app.create_app`) bounds oneDNN's kernel caches, before the server's first product."""
