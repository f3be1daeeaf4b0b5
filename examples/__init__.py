"""Runnable examples; importable from the repository root (``from examples.transformer import ...``)."""
