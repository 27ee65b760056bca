"""Activation patching's pass (``mode=patch``) vs the naive loop: every patch of a batch as ``PatchEvaluator`` runs
them against one whole forward per patch.

    python benchmarks/patch_speed.py [--shape tiny|minilm|bert-base] [--device cpu|cuda] [--batch B] [--seq N]
        [--sites head,attention,mlp,residual] [--per-forward K] [--rounds 5]

Random weights of a BERT classifier in the named shape, a batch of rows padded to N/2..N tokens and its corrupted
copy (other tokens, the same padding). ``headlab``: ``PatchEvaluator.validation_step`` (one forward per run records
every site; a layer's patches start at that layer, ``--per-forward`` of them stacked in one forward: 0 picks as the
job does, one on a CPU, a layer's on a GPU). ``naive``: the same patches, each a whole forward of the clean batch
with the site's activation replaced (``activation_sites.patched``), the corrupted activations recorded once, as a
user's loop over sites would. The ratio is headlab's seconds over naive's (lower is better); the layer-reuse bound
(no stacking) is (L + 1) / 2L of the layers' work.
"""

from __future__ import annotations

import statistics

import torch
from common import SHAPES, Parser, add_device_arguments, alternating_rounds, check_device, machine
from transformers import BertConfig, BertForSequenceClassification

from headlab.analysis.patching.patch_evaluator import PatchEvaluator, patch_specs
from headlab.core.activation_sites import Patch, patched, recorded


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--batch", type=int, help="default: the shape's")
    parser.add_argument("--seq", type=int, help="default: the shape's")
    parser.add_argument("--sites", default="head,attention,mlp,residual")
    parser.add_argument("--per-forward", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = check_device(parser, args.device)
    layers, heads, hidden, batch, seq = SHAPES[args.shape]
    batch, seq = args.batch or batch, args.seq or seq
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
                        intermediate_size=4 * hidden, attn_implementation="sdpa")
    model = BertForSequenceClassification(config).to(device).eval()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    rows = {"input_ids": torch.randint(1000, config.vocab_size, (batch, seq), generator=g) * mask,
            "attention_mask": mask, "corrupt_input_ids": torch.randint(1000, config.vocab_size, (batch, seq),
                                                                       generator=g) * mask,
            "labels": torch.randint(0, 2, (batch,), generator=g), "example_index": torch.arange(batch)}
    rows = {name: t.to(device) for name, t in rows.items()}
    specs = patch_specs(args.sites.split(","), layers, heads, None)
    per_forward = args.per_forward or (1 if device.type == "cpu" else max(
        sum(s.site.layer == layer for s in specs) for layer in range(layers)))
    evaluator = PatchEvaluator(model, "classification", specs, "noising", per_forward)
    clean = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}
    corrupted = clean | {"input_ids": rows["corrupt_input_ids"]}

    def headlab_pass():
        evaluator.validation_step(rows, 0)
        evaluator._pending = {}

    @torch.no_grad()
    def naive():
        with recorded(model, [s.site for s in specs]) as sources:
            model(**corrupted)
        model(**clean)
        for spec in specs:
            with patched(model, [Patch(spec.site, sources[(spec.site.kind, spec.site.layer)])]):
                model(**clean)

    times = alternating_rounds({"headlab": headlab_pass, "naive": naive}, args.rounds, 1, device)
    ratio = statistics.median(h / n for h, n in zip(times["headlab"], times["naive"]))
    print(f"{len(specs)} patches ({args.sites}), BERT {layers} x {heads}, hidden {hidden}, batch {batch} x {seq}, "
          f"{per_forward} per forward; {machine(device)}")
    for name, samples in times.items():
        print(f"{name:<8} median {statistics.median(samples):.3f} s a batch")
    print(f"ratio headlab / naive {ratio:.3f} (layer-reuse bound without stacking {(layers + 1) / (2 * layers):.3f})")


if __name__ == "__main__":
    main()
