"""headlab: what do BERT's attention heads do? Ablate, score, feature-extract and cluster them.

The public API is imported lazily, so ``import headlab`` and the command line stay fast until
torch is needed.

Layers (imports run one way, bottom up): ``errors``/``files``/``requirements`` -> ``core`` -> ``tasks`` ->
``reporting`` -> ``training`` -> ``analysis`` -> ``cli``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "POLICIES": "headlab.core.plans",
    "UNITS": "headlab.core.plans",
    "HeadPlan": "headlab.core.plans",
    "head_name": "headlab.core.head_names",
    "select_heads": "headlab.core.plans",
    "ablate": "headlab.core.patch.ablate",
    "register_attention": "headlab.core.patch.attention",
    "split_sentences": "headlab.core.units",
    "unit_ids": "headlab.core.units",
    "UserError": "headlab.errors",
    "head_importance": "headlab.core.importance",
    "ablation_estimate": "headlab.core.importance",
    "key_type_gradients": "headlab.core.importance",
    "head_gradients": "headlab.core.importance",
    "prune_heads": "headlab.core.pruning",
    "load_sweep": "headlab.reporting.sweep_table",
    "paired_ci": "headlab.reporting.statistics",
    "observe_attention": "headlab.core.observe",
    "attention_features": "headlab.analysis.types.features",
    "AttentionFeatures": "headlab.analysis.types.features",
    "head_table": "headlab.reporting.head_table",
    "HeadMeans": "headlab.core.substitutes.means",
    "head_means": "headlab.core.substitutes.means",
    "resample_sources": "headlab.core.substitutes.sources",
}
__all__ = [  # noqa: RUF022 (grouped as _EXPORTS)
    "POLICIES", "UNITS", "HeadPlan", "head_name", "select_heads", "ablate", "register_attention",
    "split_sentences", "unit_ids", "UserError", "head_importance", "ablation_estimate", "key_type_gradients",
    "head_gradients", "prune_heads", "load_sweep", "paired_ci", "observe_attention", "attention_features",
    "AttentionFeatures", "head_table", "HeadMeans", "head_means", "resample_sources",
]

if TYPE_CHECKING:
    from headlab.analysis.types.features import AttentionFeatures, attention_features
    from headlab.core.head_names import head_name
    from headlab.core.importance import ablation_estimate, head_gradients, head_importance, key_type_gradients
    from headlab.core.observe import observe_attention
    from headlab.core.patch.ablate import ablate
    from headlab.core.patch.attention import register_attention
    from headlab.core.plans import POLICIES, UNITS, HeadPlan, select_heads
    from headlab.core.pruning import prune_heads
    from headlab.core.substitutes.means import HeadMeans, head_means
    from headlab.core.substitutes.sources import resample_sources
    from headlab.core.units import split_sentences, unit_ids
    from headlab.errors import UserError
    from headlab.reporting.head_table import head_table
    from headlab.reporting.statistics import paired_ci
    from headlab.reporting.sweep_table import load_sweep


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'headlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
