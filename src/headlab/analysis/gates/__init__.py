"""Learned head gates and constants: Voita et al.'s L0 gates (``hard_concrete``), causal head gating, optimal
ablation (issue 71; the training module is shared)."""
