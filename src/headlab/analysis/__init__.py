"""Analyses of heads (one module per ``ablate.py`` mode): evaluation, sweeps, importance, features, clusters."""
