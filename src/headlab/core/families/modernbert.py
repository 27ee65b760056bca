"""ModernBERT: ``layers[i].attn`` (its ``layer_idx`` is i) calls the attention function after rotary positions and
applies ``Wo`` itself; one fused ``Wqkv`` projection (query, key and value blocks of all heads); every third layer
attends globally, the others within a sliding window that reaches ``local_attention // 2`` tokens either way (the
mask says which keys a query sees, so ``uniform`` and ``drop_*`` act inside the window). No segment ids."""

from headlab.core.families.base import Family

FAMILY = Family(name="modernbert", model_types=("modernbert",), shape_defaults={"modernbert": (22, 12)},
                layers_path="layers", attention_path="attn", output_path="attn.Wo", mlp_path="mlp.Wo",
                projections=("Wqkv",),
                fused=True, head_count=(), head_total=(), head_width="head_dim")
