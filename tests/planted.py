"""A BERT classifier set by hand whose three heads have known roles (the learned-gate tests' ground truth).

One layer of three heads (head size 2), every attention uniform (query and key weights 0), no feed-forward output:

* head 0 carries the label: its values read the label word's embedding (``+-(1, -1)`` on dimensions 0-1; every
  other word is 0 there) and the attention output writes it to the [CLS] dimensions the classifier reads;
* head 1 adds noise: its values read dimensions 2-3, where each filler word has a random embedding, and the
  attention output writes them onto the same label dimensions (with head 0 alone the model is always right; with
  both about 70% of the time);
* head 2 writes nothing (its value weights are 0).

A sentence is ``[CLS]``, six words of which one is the label word (``pos``: label 1, ``neg``: label 0) and the
others fillers, ``[SEP]``. A constant on dimensions 4-5 keeps the LayerNorm after attention about linear in the
label dimensions, so the loss is smooth in each head's gate.
"""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification

CLS, SEP, POS, NEG = 1, 2, 3, 4
FILLERS = range(5, 21)
CONFIG = dict(vocab_size=21, hidden_size=6, num_hidden_layers=1, num_attention_heads=3, intermediate_size=4,
              max_position_embeddings=16, type_vocab_size=1, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
MODEL = {"name": "planted", "random_init": True, "config": CONFIG}  # the model config group of the gated module
TASK = {"name": "planted", "type": "classification", "num_labels": 2, "eval_splits": ["validation"],
        "metrics": ["accuracy"], "main_metric": "accuracy"}
MASK = {"rules": [], "unit": "sentence", "renormalize": False}


def planted_model(label: float = 5.0, noise: float = 5.0, constant: float = 3.0, seed: int = 0
                  ) -> BertForSequenceClassification:
    """The model of the module docstring, in eval mode (float32)."""
    model = BertForSequenceClassification(BertConfig(**CONFIG, num_labels=2)).eval()
    generator = torch.Generator().manual_seed(seed)
    layer = model.bert.encoder.layer[0]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in (model.bert.embeddings.LayerNorm, layer.attention.output.LayerNorm, layer.output.LayerNorm):
            norm.weight.fill_(1.0)
        words = model.bert.embeddings.word_embeddings.weight  # [vocab, hidden]
        words[POS] = torch.tensor([1.0, -1.0, 0, 0, 0, 0])
        words[NEG] = torch.tensor([-1.0, 1.0, 0, 0, 0, 0])
        for word in FILLERS:
            a, b = torch.randn(2, generator=generator)
            words[word] = torch.tensor([0, 0, a, -a, b, -b])
        value = layer.attention.self.value.weight  # [hidden out, hidden in]: head h outputs dimensions 2h, 2h + 1
        value[0, 0] = value[1, 1] = 1.0  # head 0: the label dimensions
        value[2, 2] = value[3, 3] = 1.0  # head 1: the filler dimensions
        output = layer.attention.output.dense  # [hidden, heads x head size]
        output.weight[0, 0], output.weight[1, 0] = label, -label  # head 0 -> the label dimensions
        output.weight[0, 2], output.weight[1, 2] = noise, -noise  # head 1 -> the same dimensions
        output.bias[4], output.bias[5] = constant, -constant
        model.bert.pooler.dense.weight[0, 0] = 2.0
        model.classifier.weight[0, 0], model.classifier.weight[1, 0] = -4.0, 4.0
    return model


def planted_batches(count: int, batch_size: int = 32, seed: int = 1, length: int = 8) -> list[dict[str, torch.Tensor]]:
    """``count`` sentences of the task in batches: a random label word at a random place among random fillers."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (count,), generator=generator)
    ids = torch.randint(FILLERS.start, FILLERS.stop, (count, length), generator=generator)
    ids[:, 0], ids[:, -1] = CLS, SEP
    where = torch.randint(1, length - 1, (count,), generator=generator)
    ids[torch.arange(count), where] = torch.where(labels == 1, POS, NEG)
    return [{"input_ids": ids[i:i + batch_size], "attention_mask": torch.ones_like(ids[i:i + batch_size]),
             "token_type_ids": torch.zeros_like(ids[i:i + batch_size]), "labels": labels[i:i + batch_size]}
            for i in range(0, count, batch_size)]
