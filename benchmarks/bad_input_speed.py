"""How long a bad command takes to answer: every row of the bad-input table (``tests/test_bad_input.py``), run as
the test runs it (a fresh process of the real entry script, offline, empty Hugging Face cache), one at a time.

    python benchmarks/bad_input_speed.py [--rounds 3] [--only TEXT]

Each round runs every row once, in order; the rounds alternate with runs of the obvious alternative's floor,
``python -c "import torch, transformers, lightning"`` (what every row paid before the checks ran before those
imports). Prints the median seconds per row, the rows over 2 s, and the median row against that floor.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_bad_input import CASES, make_files, run

LIMIT_S = 2.0
FLOOR = [sys.executable, "-c", "import torch, transformers, lightning"]


def timed(function, *arguments) -> float:
    start = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - start


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help="only the rows whose command contains this text")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    cases = [case for case in CASES if args.only is None or args.only in " ".join([case[0], *case[1]])]
    if not cases:
        parser.error(f"--only {args.only!r} matches no row of the table")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "files").mkdir()
        files = make_files(root / "files")
        seconds: list[list[float]] = [[] for _ in cases]
        floor = []
        for round_ in range(args.rounds):
            floor.append(timed(subprocess.run, FLOOR))
            for index, (script, overrides, _) in enumerate(cases):
                work = root / f"round{round_}" / f"case{index}"
                work.mkdir(parents=True)
                seconds[index].append(timed(run, script, overrides, files, work))
    medians = [statistics.median(row) for row in seconds]
    for (script, overrides, _), median in sorted(zip(cases, medians), key=lambda pair: -pair[1]):
        print(f"{median:6.2f} s  {script} {' '.join(overrides)}")
    over = sum(median > LIMIT_S for median in medians)
    floor_s = statistics.median(floor)
    print(f"\n{len(cases)} rows, {args.rounds} rounds: median row {statistics.median(medians):.2f} s, slowest "
          f"{max(medians):.2f} s, {over} over {LIMIT_S:.0f} s; importing torch, transformers and Lightning alone: "
          f"{floor_s:.2f} s (median row / that: {statistics.median(medians) / floor_s:.2f}x)")


if __name__ == "__main__":
    main()
