"""What the fused drop_* route (``attention_route=flex``) costs when batches come in many sequence lengths.

    python benchmarks/flex_lengths.py --device cuda --dtype bfloat16 --shape bert-base [--lengths 64,80,96,...]

Evaluation pads each batch to its longest row, so a run sees many lengths, and the route's compiled kernel
specialises on shapes: on CUDA, torch recompiles once with dynamic shapes at the second length; on CPU, once per
length. For each length in turn (half the heads under ``--policy``) the script prints the first forward (with any
compilation), the next forward, stock SDPA's forward, and the graphs compiled so far, so the start-up cost and
whether later lengths recompile can be read off directly.
"""

from __future__ import annotations

import statistics

import torch
from attention_overhead import make_batch
from common import DTYPES, SHAPES, Parser, add_device_arguments, check_device, clock, machine, random_bert
from torch._dynamo.utils import counters

import headlab


def lengths(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 2:
        raise ValueError(text)
    return values


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--policy", default="drop_intra", choices=["drop_intra", "drop_inter"])
    parser.add_argument("--renormalize", action="store_true")
    parser.add_argument("--batch", type=int, help="default: the shape's (attention_overhead.py)")
    parser.add_argument("--lengths", default="64,80,96,112,128,100,72,128", type=lengths,
                        help="comma-separated sequence lengths, in the order the batches come")
    parser.add_argument("--repeat", type=int, default=3, help="steady-state forwards per length (median)")
    args = parser.parse_args()
    device, dtype = check_device(parser, args.device), DTYPES[args.dtype]
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    model = random_bert(args.shape, device, dtype)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    plan = headlab.HeadPlan.from_rules([{"heads": f"H0-{heads // 2 - 1}", "policy": args.policy}], layers, heads)
    headlab.set_attention_route(model, "flex")
    batch = args.batch or SHAPES[args.shape][3]

    def seconds(run) -> float:
        start = clock(device)
        run()
        return clock(device) - start

    print(f"{args.shape} ({layers} x {heads} heads), {args.dtype}, batch {batch}, half the heads {args.policy}"
          f"{' renormalised' if args.renormalize else ''}, fused route; {machine(device)}")
    print(f"{'length':>6} {'first ms':>10} {'next ms':>9} {'stock ms':>9} {'graphs':>7}")
    with torch.inference_mode():
        for length in args.lengths:
            inputs, sentence_ids = make_batch(batch, length, model.config.vocab_size, True, device)

            def fused(inputs=inputs, sentence_ids=sentence_ids):
                with headlab.ablate(model, plan, renormalize=args.renormalize):
                    model(**inputs, sentence_ids=sentence_ids)

            first = seconds(fused)
            steady = statistics.median(seconds(fused) for _ in range(args.repeat))
            stock = statistics.median(seconds(lambda inputs=inputs: model(**inputs)) for _ in range(args.repeat))
            print(f"{length:>6} {first * 1e3:>10.1f} {steady * 1e3:>9.2f} {stock * 1e3:>9.2f} "
                  f"{counters['stats']['unique_graphs']:>7}")


if __name__ == "__main__":
    main()
