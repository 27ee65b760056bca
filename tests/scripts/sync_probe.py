"""Where does a forward synchronise with the host? Prints the Python stack of every synchronising CUDA call.

    python tests/scripts/sync_probe.py [RULES_JSON]      (needs CUDA; default plan: every policy once)

Runs the stock model, then the model under the plan (both renormalize settings), with
``torch.cuda.set_sync_debug_mode("warn")``; each warning is reported with the frames that led to it.
"""

import json
import sys
import traceback
import warnings

import torch
from transformers import BertConfig, BertModel

import headlab

RULES = [{"heads": "L0H0", "policy": "prune"}, {"heads": "L0H1", "policy": "uniform"},
         {"heads": "L1H0", "policy": "drop_intra"}, {"heads": "L1H1", "policy": "drop_inter"}]


def main(rules) -> None:
    model = BertModel(BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=37,
                                 attn_implementation="sdpa")).cuda().eval()
    ids = torch.randint(1000, 2000, (3, 16), device="cuda")
    mask = torch.ones(3, 16, dtype=torch.long, device="cuda")
    mask[1, 10:] = 0
    units = (torch.arange(16, device="cuda") // 5).expand(3, 16)
    plan = headlab.HeadPlan.from_rules(rules, 2, 4)

    def report(message, category, filename, lineno, file=None, line=None):
        print(f"--- {message}")
        print("".join(traceback.format_stack()[-9:-1]))

    warnings.showwarning = report
    runs = {"stock": lambda: model(input_ids=ids, attention_mask=mask)}
    for renormalize in (False, True):
        def run(renormalize=renormalize):
            with headlab.ablate(model, plan, renormalize=renormalize):
                model(input_ids=ids, attention_mask=mask, sentence_ids=units)
        runs[f"plan renormalize={renormalize}"] = run
    with torch.no_grad():
        for name, run in runs.items():
            run()  # warm-up
            torch.cuda.synchronize()
            print(f"=== {name}")
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                run()
            torch.cuda.set_sync_debug_mode("default")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else RULES)
