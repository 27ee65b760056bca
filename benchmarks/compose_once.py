"""What composing the config once saves a command (``headlab.cli.hydra_mode``): a command refused after its config
is composed, run in fresh processes, as shipped and with Hydra's first composition back (``compose_once`` a no-op in
that process), the two alternating.

    python benchmarks/compose_once.py [--rounds 9]

Prints the median seconds of each and their ratio.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Parser

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["model=tiny_random", "logger=none", "task=demo_pairs", "mode=eval", "allow_random_head=true", "mask=prune",
           "mask.heads=5"]  # refused after composition: "head selector 5 is not a string"
TWICE = ("import runpy, sys; import headlab.cli.hydra_mode as m; m.compose_once = lambda: None; "
         "import headlab.cli.errors as e; e.compose_once = m.compose_once; sys.argv = ['ablate.py', *sys.argv[1:]]; "
         "runpy.run_path('ablate.py', run_name='__main__')")


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 2 or "head selector 5 is not a string" not in result.stderr:
        sys.exit(f"error: the benchmark's command did not answer as expected: {result.stderr[-500:]}")
    return seconds


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    with tempfile.TemporaryDirectory() as folder:
        words = [*COMMAND, f"data.cache_dir={folder}/cache", f"hydra.run.dir={folder}/run"]
        once, twice = [], []
        for _ in range(args.rounds):
            once.append(timed([sys.executable, "ablate.py", *words]))
            twice.append(timed([sys.executable, "-c", TWICE, *words]))
    a, b = statistics.median(once), statistics.median(twice)
    print(f"composed once: {a:.3f} s, twice (Hydra's way): {b:.3f} s, median of {args.rounds}; ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
