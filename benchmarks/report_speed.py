"""Report statistics speed: headlab's paired statistics for a whole head sweep vs scipy.stats.bootstrap per job.

    python benchmarks/report_speed.py [--jobs 72] [--examples 10000] [--resamples 10000] [--naive-jobs 6]

Synthetic SQuAD-like records (per-question EM in {0, 1}) of ``--jobs`` plans (MiniLM: 6 x 12 = 72)
and one baseline. ``headlab``: ``paired_tests`` on every job at once (BCa bootstrap CI with
``--resamples`` resamples and a permutation p-value with as many swaps). ``naive``: what one writes
without it, ``scipy.stats.bootstrap`` (paired, vectorized mean difference, BCa, same resamples) called
per job; timed on ``--naive-jobs`` jobs and scaled to ``--jobs`` (each job costs the same). The ratio is
headlab seconds / naive seconds; headlab's side also includes the permutation tests, the naive one does not.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.stats
from common import Parser

from headlab.reporting.statistics import Resampling, paired_tests


def records(jobs: int, examples: int) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(0)
    baseline = (rng.random(examples) < 0.8).astype(np.float64)
    runs = []
    for job in range(jobs):
        flips = rng.random(examples) < 0.02 * (1 + job % 5)
        runs.append({"exact_match": np.where(flips, 1.0 - baseline, baseline), "f1": baseline, "loss": baseline})
    return runs, {"exact_match": baseline, "f1": baseline, "loss": baseline}


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=72)
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--naive-jobs", type=int, default=6, help="jobs the naive side is timed on (then scaled)")
    args = parser.parse_args()
    if min(args.jobs, args.examples, args.resamples, args.naive_jobs) < 1 or args.examples < 2:
        parser.error("--jobs, --resamples and --naive-jobs must be positive, --examples at least 2")
    runs, baseline = records(args.jobs, args.examples)
    config = Resampling(resamples=args.resamples, permutations=args.resamples, method="bca")

    start = time.perf_counter()
    results = paired_tests("exact_match", runs, baseline, config)
    ours = time.perf_counter() - start

    start = time.perf_counter()
    naive = []
    for run in runs[: args.naive_jobs]:
        naive.append(scipy.stats.bootstrap(
            (run["exact_match"], baseline["exact_match"]), lambda a, b, axis: 100 * a.mean(axis) - 100 * b.mean(axis),
            paired=True, vectorized=True, n_resamples=args.resamples, method="BCa",
            rng=np.random.default_rng(0)).confidence_interval)
    naive_seconds = (time.perf_counter() - start) * args.jobs / min(args.naive_jobs, args.jobs)
    # EM deltas are multiples of 100 / examples: bounds may differ by one such step where float rounding decides
    # whether a resample ties the observed delta (BCa's bias correction counts ties).
    gaps = [max(abs(r.ci_low - n.low), abs(r.ci_high - n.high)) for r, n in zip(results, naive)]
    step = max(gaps) / (100 / args.examples)
    print(f"{args.jobs} jobs x {args.examples} examples, {args.resamples} resamples (BCa) + "
          f"{args.resamples} permutations")
    print(f"headlab paired_tests (all jobs, CIs and p-values): {ours:.2f} s")
    print(f"scipy.stats.bootstrap per job (CIs only): {naive_seconds:.2f} s "
          f"(timed on {min(args.naive_jobs, args.jobs)} jobs, scaled)")
    print(f"ratio headlab / naive: {ours / naive_seconds:.3f}; largest CI bound difference: {step:.2f} steps of 100/n")


if __name__ == "__main__":
    main()
