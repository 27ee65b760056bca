"""Forward-pass cost of headlab's patched attention vs stock SDPA on MiniLM.

    python benchmarks/attention_overhead.py [--batch 32] [--seq 128] [--rounds 15] [--heads H0-5]

Half the heads (``--heads``, default H0-5 of every layer) get each policy in turn; every round
times the stock model and each patched policy once, in alternating order, and the script
prints the median time per forward and the median of the per-round ratios to stock SDPA.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from omegaconf import OmegaConf

import headlab
from headlab.cli.schema import register_configs
from headlab.core.models import load_model

TARGETS = {"keep": 1.05, "prune": 1.05, "uniform": 1.05, "drop_intra": 1.5, "drop_inter": 1.5}


def make_batch(batch: int, seq: int, vocab: int, padded: bool):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g) if padded else torch.full((batch,), seq)
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()  # [batch, seq]
    input_ids = input_ids * attention_mask
    sentence_ids = torch.arange(seq)[None, :].expand(batch, seq) * 4 // lengths[:, None]  # 4 units per row
    return {"input_ids": input_ids, "attention_mask": attention_mask}, sentence_ids


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--heads", default="H0-5")
    parser.add_argument("--no-padding", action="store_true", help="full-length rows (the mask reaches SDPA as None)")
    args = parser.parse_args()

    register_configs()
    model = load_model(OmegaConf.load("conf/model/minilm.yaml"))
    inputs, sentence_ids = make_batch(args.batch, args.seq, model.config.vocab_size, not args.no_padding)
    plans = {
        policy: headlab.HeadPlan.from_rules([{"heads": args.heads, "policy": policy}], 6, 12) for policy in TARGETS
    }

    def stock():
        model(**inputs)

    def patched(policy, renormalize=False):
        def run():
            with headlab.ablate(model, plans[policy], renormalize=renormalize):
                model(**inputs, sentence_ids=sentence_ids)

        return run

    runs = {"stock sdpa": stock, **{policy: patched(policy) for policy in TARGETS}}
    runs |= {f"{policy}+renorm": patched(policy, True) for policy in ("drop_intra", "drop_inter")}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for run in runs.values():  # warm-up
            run()
        for round_ in range(args.rounds):
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for name in order:
                times[name].append(timed(runs[name]))

    print(f"MiniLM-L6 forward, batch {args.batch} x {args.seq} tokens, padded={not args.no_padding}, "
          f"heads {args.heads} per policy, {args.rounds} alternating rounds")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"{'policy':<17} {'median ms':>10} {'ratio':>7} {'target':>7}")
    for name, samples in times.items():
        ratios = [t / s for t, s in zip(samples, times["stock sdpa"])]
        target = TARGETS.get(name.removesuffix("+renorm"))
        verdict = "" if target is None else ("ok" if statistics.median(ratios) <= target else "MISS")
        print(f"{name:<17} {statistics.median(samples) * 1e3:>10.1f} {statistics.median(ratios):>7.3f} "
              f"{'' if target is None else f'<={target}':>7} {verdict}")


if __name__ == "__main__":
    main()
