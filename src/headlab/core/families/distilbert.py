"""DistilBERT: ``transformer.layer[i].attention`` (no ``layer_idx``: the depth is the layer's position) calls the
attention function and applies ``out_lin`` itself; ``q_lin``, ``k_lin``, ``v_lin``; ``n_layers`` x ``n_heads`` in
its config.json. Pairs are ``[CLS] A [SEP] B [SEP]``; the model takes no segment ids."""

from headlab.core.families.base import Family

FAMILY = Family(name="distilbert", model_types=("distilbert",), shape_defaults={"distilbert": (6, 12)},
                shape_keys=("n_layers", "n_heads"), width_key="dim", layers_path="transformer.layer",
                attention_path="attention", output_path="attention.out_lin", mlp_path="ffn.lin2",
                projections=("q_lin", "k_lin", "v_lin"), head_count=("n_heads",), head_total=())
