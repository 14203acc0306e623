"""Shared test helpers (tiny offline tokenizer and models)."""
