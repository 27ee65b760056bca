"""What a head does: head plans and selectors, the patched attention and ``ablate``, unit ids, models."""
