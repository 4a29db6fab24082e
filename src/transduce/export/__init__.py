"""A trained model in the engines other stacks run, exactly: CTranslate2 (`ct2`) and Hugging
Face's MarianMT (`marian`, read back bitwise by `import_marian`). Their traps: docs/export.md."""
