"""Forward-pass cost of headlab's patched attention vs stock SDPA, the plan entered per forward.

    python benchmarks/attention_overhead.py [--shape tiny|dispatch|minilm|bert-base|bert-large] [--device cpu|cuda]
        [--dtype float32|bfloat16|float16] [--batch B] [--seq N] [--rounds 15]
        [--threads N] [--family bert|roberta|electra|distilbert|albert|deberta-v2|modernbert] [--only TEXT,...]

Random weights in the named shape (speed does not depend on them), of the family's model (``--family``: its own
stock model is the baseline, the same attention implementation: SDPA, DeBERTa's own); rows padded to N/2..N tokens
(``--no-padding``: full rows); ``--groups``: the ``drop_*`` plans also with one SDPA call per group of heads (on a
GPU, as before ``layer_states.JointCall``; on a CPU, as always), for the comparison; ``--only``: the plans whose
names contain one of the texts (``--only "one head"``: more rounds in the same time). Plans: the identity (every
head ``keep``), one head (the middle layer's head 0) under prune / uniform / drop_intra, and half the heads of every
layer under each policy. Each forward enters ``headlab.ablate`` as the Lightning module does per batch. Every round
times the stock model and each plan once, in alternating order; the script prints the median time
per forward and the median of the per-round ratios to stock SDPA, with the target.
"""

from __future__ import annotations

import statistics

import torch
from common import (
    DTYPES,
    FAMILY_TYPES,
    SHAPES,
    Parser,
    add_device_arguments,
    alternating_rounds,
    check_device,
    machine,
    random_encoder,
)

import headlab
from headlab.core.patch import attention


def plans(layers: int, heads: int, gpu: bool) -> dict[str, tuple[list, bool, float]]:
    """Plan name -> (rules, renormalize, target ratio to stock SDPA); BENCHMARKS.md gives the targets."""
    one, half = f"L{layers // 2}H0", f"H0-{heads // 2 - 1}"
    cheap, drop, renorm = (1.02, 1.25, 1.15) if gpu else (1.05, 1.5, 1.5)
    table = {"identity (all keep)": ([], False, cheap)}
    for policy in ("prune", "uniform", "drop_intra"):
        table[f"one head {policy}"] = ([{"heads": one, "policy": policy}], False, 1.03 if gpu else cheap)
    targets = {"prune": cheap, "uniform": 1.05, "drop_intra": drop, "drop_inter": drop}
    for policy, target in targets.items():
        table[f"half {policy}"] = ([{"heads": half, "policy": policy}], False, target)
    for policy in ("drop_intra", "drop_inter"):
        table[f"half {policy} renorm"] = ([{"heads": half, "policy": policy}], True, renorm)
    return table


def make_batch(batch: int, seq: int, vocab: int, padded: bool, device: torch.device):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g) if padded else torch.full((batch,), seq)
    attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()  # [batch, seq]
    sentence_ids = torch.arange(seq)[None, :].expand(batch, seq) * 4 // lengths[:, None]  # 4 units per row
    inputs = {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask}
    return {k: v.to(device) for k, v in inputs.items()}, sentence_ids.to(device)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--batch", type=int, help="default: 32 (minilm, bert-large) or 64 (bert-base)")
    parser.add_argument("--seq", type=int, help="default: 128, or 384 for bert-large")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=1, help="forwards per timed sample (GPU: steadier timings)")
    parser.add_argument("--no-padding", action="store_true", help="full-length rows")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--family", default="bert", choices=FAMILY_TYPES, help="the model's family (its model_type)")
    parser.add_argument("--groups", action="store_true",
                        help="also the drop_* plans with one SDPA call per group of heads (on a GPU: before JointCall)")
    parser.add_argument("--only", help="comma-separated texts: only the plans whose names contain one (and stock)")
    args = parser.parse_args()
    device = check_device(parser, args.device)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads {args.threads}: give 1 or more")
        torch.set_num_threads(args.threads)
    layers, heads, _, default_batch, default_seq = SHAPES[args.shape]
    chosen = list(plans(layers, heads, False))
    if args.only:
        texts = [text.strip() for text in args.only.split(",") if text.strip()]
        chosen = [name for name in chosen if any(text in name for text in texts)]
        if not chosen:
            parser.error(f"--only {args.only!r} names no plan; plans: {', '.join(plans(layers, heads, False))}")
    batch, seq = args.batch or default_batch, args.seq or default_seq

    model = random_encoder(args.family, args.shape, device, DTYPES[args.dtype])
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    inputs, sentence_ids = make_batch(batch, seq, model.config.vocab_size, not args.no_padding, device)
    table = {name: row for name, row in plans(layers, heads, device.type == "cuda").items() if name in chosen}

    def stock():
        model(**inputs)

    joint_limits = dict(attention.JOINT_MAX_ELEMENTS)

    def patched(rules, renormalize, joint=True):
        plan = headlab.HeadPlan.from_rules(rules, layers, heads)

        def run():
            attention.JOINT_MAX_ELEMENTS = joint_limits if joint else {}
            with headlab.ablate(model, plan, renormalize=renormalize):
                return model(**inputs, sentence_ids=sentence_ids).last_hidden_state

        return run

    baseline = f"stock {model.config._attn_implementation}"  # sdpa; DeBERTa's own: eager
    runs = {baseline: stock, **{name: patched(*row[:2]) for name, row in table.items()}}
    if args.groups:
        runs |= {f"{name}, groups": patched(*table[name][:2], joint=False) for name in table if "drop" in name}
    with torch.inference_mode():  # the warm-up calls build each plan's state once
        times = alternating_rounds(runs, args.rounds, args.repeat, device)

    print(f"{args.family} {args.shape} ({layers} x {heads} heads) forward, {args.dtype}, batch {batch} x {seq} tokens, "
          f"padded={not args.no_padding}, {args.rounds} rounds x {args.repeat} forwards; {machine(device)}")
    print(f"{'plan':<31} {'median ms':>10} {'ratio':>7} {'target':>7}")
    for name, samples in times.items():
        ratio = statistics.median(t / s for t, s in zip(samples, times[baseline]))
        target = table[name.removesuffix(", groups")][2] if name != baseline else None
        verdict = "" if target is None else ("ok" if ratio <= target else "MISS")
        print(f"{name:<31} {statistics.median(samples) * 1e3:>10.2f} {ratio:>7.3f} "
              f"{'' if target is None else f'<={target}':>7} {verdict}")


if __name__ == "__main__":
    main()
