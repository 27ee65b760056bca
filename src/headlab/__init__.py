"""headlab: what do BERT's attention heads do? Ablate, score, feature-extract and cluster them."""

from headlab.attention import ablate, register_attention
from headlab.plans import POLICIES, UNITS, HeadPlan, head_name, select_heads
from headlab.units import split_sentences, unit_ids

__version__ = "0.1.0"
__all__ = [
    "POLICIES",
    "UNITS",
    "HeadPlan",
    "ablate",
    "head_name",
    "register_attention",
    "select_heads",
    "split_sentences",
    "unit_ids",
]
