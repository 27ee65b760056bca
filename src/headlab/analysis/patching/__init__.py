"""Activation patching between clean and corrupted inputs (``ablate.py mode=patch``, docs/patching.md)."""
