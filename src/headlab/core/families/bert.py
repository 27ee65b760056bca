"""BERT, ELECTRA and ERNIE: ``encoder.layer[i].attention.self`` calls the attention function (its ``layer_idx`` is
i), ``attention.output.dense`` mixes the heads; pairs are ``[CLS] A [SEP] B [SEP]`` with segment ids."""

from headlab.core.families.base import Family

FAMILY = Family(name="bert", model_types=("bert", "electra", "ernie"),
                shape_defaults={"bert": (12, 12), "electra": (12, 4), "ernie": (12, 12)})
