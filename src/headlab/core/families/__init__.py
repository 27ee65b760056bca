"""The encoder families headlab patches, one module each; ``family_for(model_type)`` picks one (no torch needed)."""

from __future__ import annotations

from typing import Any

from headlab.core.families import albert, bert, deberta, distilbert, modernbert, roberta
from headlab.core.families.base import Family
from headlab.errors import UserError

FAMILIES: tuple[Family, ...] = (bert.FAMILY, roberta.FAMILY, distilbert.FAMILY, albert.FAMILY, deberta.FAMILY,
                                modernbert.FAMILY)
MODEL_TYPES: dict[str, Family] = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_for(model_type: Any) -> Family:
    """The family of a config's ``model_type``; a ``UserError`` listing the known ones otherwise."""
    family = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise UserError(f"model_type {model_type!r} is not a supported BERT-family encoder; supported: "
                        f"{', '.join(MODEL_TYPES)}")
    return family


def family_of(model: Any) -> Family:
    """The family of a loaded model (from its config's ``model_type``)."""
    return family_for(getattr(model.config, "model_type", None))
