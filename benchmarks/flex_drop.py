"""A fused ``drop_*`` route with FlexAttention against headlab's SDPA route: exactness first, then speed.

    python benchmarks/flex_drop.py --device cuda --dtype bfloat16 --shape bert-base [--policy drop_inter]
                                   [--renormalize] [--rounds 9] [--repeat 3]

What it decides: whether ``drop_*`` on half the heads, the rows that miss the GPU targets (BENCHMARKS.md), gets
within them when each layer is one compiled ``flex_attention`` call instead of headlab's two SDPA calls (keep
heads; ``drop_*`` heads over doubled keys with a materialised ``[batch, 1, seq, 2 seq]`` mask). Here the mask is
never materialised: ``mask_mod`` reads the key validity and the unit ids (``[batch, seq]`` each) inside the
kernel, and the block mask lets the keep heads skip the doubled keys' second half. The plan: the first half of
every layer's heads under ``--policy``, the rest kept (the benchmark's "half" rows).

- not renormalised: keys ``[K; K]``, values ``[V; 0]``; a ``drop_*`` head's query sees its allowed keys in the
  first copy and its other valid keys in the second (normaliser only), as headlab's route does;
- renormalised: the allowed keys only; a query with none gets 0 (FlexAttention's fully masked row).

Each configuration first checks that the fused route gives headlab's hidden states (valid rows, tolerance by
dtype; exit status 1 if not), then times stock SDPA, headlab and the fused route in alternating rounds (plan
entered per forward, block mask built per forward) and prints the medians and per-round ratios to stock.
FlexAttention is compiled (``torch.compile``): the first forwards compile it. On a CPU this only checks
exactness (the compiled CPU kernel is far slower than SDPA at BERT head sizes).
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from attention_overhead import make_batch
from common import DTYPES, SHAPES, Parser, add_device_arguments, alternating_rounds, check_device, machine, random_bert
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import headlab
from headlab.core.sdpa_masks import padding_mask_function

FLEX_NAME = "headlab_flex_prototype"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}  # the dtypes of DTYPES


class FlexRoute:
    """The attention function of the fused route: one ``flex_attention`` call per layer over all heads."""

    def __init__(self, dropped: torch.Tensor, policy: str, renormalize: bool):
        self.dropped = dropped  # [heads] bool: the heads under the drop policy (the same in every layer)
        self.intra = policy == "drop_intra"
        self.renormalize = renormalize
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.make_block_mask = torch.compile(create_block_mask)  # a new mask_mod per forward: no recompilation
        self.cached: tuple | None = None  # (sentence_ids, attention_mask, block mask) of the latest forward

    def block_mask(self, valid: torch.Tensor, units: torch.Tensor, heads: int):
        """``valid`` and ``units``: ``[batch, seq]``. Built once per forward, shared by every layer."""
        batch, seq = units.shape
        dropped, intra = self.dropped, self.intra

        def allowed(b, q, kv):
            same = units[b, q] == units[b, kv]
            return ~same if intra else same

        if self.renormalize:
            def mask_mod(b, h, q, kv):
                return valid[b, kv] & (~dropped[h] | allowed(b, q, kv))
            keys = seq
        else:
            def mask_mod(b, h, q, kv):  # kv < seq: the first copy of the keys; kv >= seq: the second
                first = kv < seq
                key = torch.where(first, kv, kv - seq)
                return valid[b, key] & torch.where(dropped[h], first == allowed(b, q, key), first)
            keys = 2 * seq
        return self.make_block_mask(mask_mod, batch, heads, seq, keys, device=units.device)

    def __call__(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """query/key/value ``[batch, heads, seq, head_dim]`` -> ``[batch, seq, heads, head_dim]``."""
        units, seq = kwargs["sentence_ids"], query.shape[2]
        if self.cached is None or self.cached[0] is not units or self.cached[1] is not attention_mask:
            # [batch, seq]: headlab's padding mask is [batch, 1, 1, seq] (None: no padding)
            valid = torch.ones_like(units, dtype=torch.bool) if attention_mask is None else attention_mask[:, 0, 0, :]
            self.cached = (units, attention_mask, self.block_mask(valid, units, query.shape[1]))
        if not self.renormalize:
            key, value = torch.cat([key, key], dim=2), F.pad(value, (0, 0, 0, seq))  # [K; K], [V; 0]
        out = self.flex(query, key, value, block_mask=self.cached[2], scale=scaling)
        return out.transpose(1, 2).contiguous(), None


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--policy", default="drop_intra", choices=["drop_intra", "drop_inter"])
    parser.add_argument("--renormalize", action="store_true")
    parser.add_argument("--batch", type=int, help="default: the shape's (attention_overhead.py)")
    parser.add_argument("--seq", type=int, help="default: the shape's")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=1, help="forwards per timed sample")
    args = parser.parse_args()
    device, dtype = check_device(parser, args.device), DTYPES[args.dtype]
    if args.rounds < 1 or args.repeat < 1:
        parser.error(f"--rounds {args.rounds} and --repeat {args.repeat} must be at least 1")
    *_, default_batch, default_seq = SHAPES[args.shape]
    model = random_bert(args.shape, device, dtype)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    inputs, sentence_ids = make_batch(args.batch or default_batch, args.seq or default_seq,
                                      model.config.vocab_size, True, device)
    plan = headlab.HeadPlan.from_rules([{"heads": f"H0-{heads // 2 - 1}", "policy": args.policy}], layers, heads)
    route = FlexRoute(torch.arange(heads, device=device) < heads // 2, args.policy, args.renormalize)
    AttentionInterface.register(FLEX_NAME, route)
    AttentionMaskInterface.register(FLEX_NAME, padding_mask_function)

    def stock():
        return model(**inputs).last_hidden_state

    def headlab_route():
        with headlab.ablate(model, plan, renormalize=args.renormalize):
            return model(**inputs, sentence_ids=sentence_ids).last_hidden_state

    def fused_route():
        original, model.config._attn_implementation_internal = model.config._attn_implementation_internal, FLEX_NAME
        try:
            return model(**inputs, sentence_ids=sentence_ids).last_hidden_state
        finally:
            model.config._attn_implementation_internal = original

    runs = {"stock sdpa": stock, "headlab (SDPA route)": headlab_route, "fused (FlexAttention)": fused_route}
    label = f"half {args.policy}{' renorm' if args.renormalize else ''}"
    print(f"{args.shape} ({layers} x {heads} heads), {args.dtype}, {label}; {machine(device)}")
    with torch.inference_mode():
        valid = inputs["attention_mask"].bool()
        expected, fused = headlab_route()[valid].double(), fused_route()[valid].double()
        error = ((fused - expected).abs().max() / expected.abs().max().clamp(min=1.0)).item()
        print(f"fused vs headlab: max abs difference {error:.2e} of the largest value (tolerance {TOLERANCE[dtype]})")
        if not error <= TOLERANCE[dtype]:
            raise SystemExit(1)
        times = alternating_rounds(runs, args.rounds, args.repeat, device)  # warm-up compiles FlexAttention
    print(f"{'route':<24} {'median ms':>10} {'ratio':>7}   ({args.rounds} rounds x {args.repeat} forwards)")
    for name, samples in times.items():
        ratio = statistics.median(t / s for t, s in zip(samples, times["stock sdpa"]))
        print(f"{name:<24} {statistics.median(samples) * 1e3:>10.2f} {ratio:>7.3f}")


if __name__ == "__main__":
    main()
