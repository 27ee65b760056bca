"""RoBERTa, XLM-R and CamemBERT: BERT's modules; pairs are ``<s> A </s></s> B </s>`` without segment ids, so a
token's sentence comes from the tokenizer's sequence ids (as for every family: ``headlab.core.units``)."""

from headlab.core.families.base import Family

FAMILY = Family(name="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
                shape_defaults={"roberta": (12, 12), "xlm-roberta": (12, 12), "camembert": (12, 12)})
