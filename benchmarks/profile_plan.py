"""Where a forward under a plan spends its time: torch.profiler's top operators, stock model vs the plan.

    python benchmarks/profile_plan.py --device cuda --dtype bfloat16 --shape bert-base --heads H0-5 --policy drop_intra
"""

from __future__ import annotations

import torch
from attention_overhead import make_batch
from common import DTYPES, SHAPES, Parser, add_device_arguments, check_device, random_bert
from torch.profiler import ProfilerActivity, profile

import headlab


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--heads", help="head selector (default: the first half of every layer's heads)")
    parser.add_argument("--policy", default="drop_intra", choices=list(headlab.POLICIES))
    parser.add_argument("--renormalize", action="store_true")
    parser.add_argument("--rows", type=int, default=15, help="operators to print")
    args = parser.parse_args()
    device = check_device(parser, args.device)
    model = random_bert(args.shape, device, DTYPES[args.dtype])
    *_, batch, seq = SHAPES[args.shape]
    inputs, sentence_ids = make_batch(batch, seq, model.config.vocab_size, True, device)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    selector = args.heads or f"H0-{heads // 2 - 1}"
    try:
        plan = headlab.HeadPlan.from_rules([{"heads": selector, "policy": args.policy}], layers, heads)
    except headlab.UserError as error:
        parser.error(f"--heads {selector!r}: {error}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"

    def forward(patched: bool) -> None:
        if not patched:
            model(**inputs)
            return
        with headlab.ablate(model, plan, renormalize=args.renormalize):
            model(**inputs, sentence_ids=sentence_ids)

    with torch.inference_mode():
        for patched in (False, True):
            for _ in range(3):
                forward(patched)
            with profile(activities=activities) as prof:
                for _ in range(5):
                    forward(patched)
            print(f"=== {'plan ' + args.policy + ' on ' + selector if patched else 'stock'} (5 forwards)")
            print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
