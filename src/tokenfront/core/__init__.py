"""The render core: checkpoint loading, templates, tokenization, fingerprint. Knows no HTTP."""
