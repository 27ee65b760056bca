"""What the benchmarks share: one-line argument errors, model shapes, random-weight BERTs, a device clock."""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import AutoConfig, AutoModel, BertConfig, BertModel

# name -> (layers, heads, hidden size, default batch, default sequence length); feed-forward 4 x hidden
# tiny: tests' tiny_random shape; on a CPU its steps are launch-bound as a GPU's are (per-call overhead shows)
# dispatch: BERT-base's 12 x 12 heads at hidden 96 and one row of 32 tokens: each op's dispatch dominates, as on a GPU
SHAPES = {"tiny": (3, 4, 32, 32, 128), "dispatch": (12, 12, 96, 1, 32), "minilm": (6, 12, 384, 32, 128),
          "bert-base": (12, 12, 768, 64, 128), "bert-large": (24, 16, 1024, 32, 384)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Parser(argparse.ArgumentParser):
    """argparse with headlab's error style: one ``error: ...`` line, exit status 2."""

    def error(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def add_device_arguments(parser: Parser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--shape", default="minilm", choices=list(SHAPES), help="model shape (random weights)")


def check_device(parser: Parser, device: str) -> torch.device:
    if not (device == "cpu" or device.startswith("cuda")):
        parser.error(f"--device {device!r} is not allowed; choose cpu or cuda[:N]")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__})")
    return torch.device(device)


def random_bert(shape: str, device: torch.device, dtype: torch.dtype = torch.float32, **config) -> BertModel:
    """A BERT of the named shape with random weights (speed does not depend on the weights), in eval mode."""
    torch.manual_seed(0)
    layers, heads, hidden, _, _ = SHAPES[shape]
    bert_config = BertConfig(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
                             intermediate_size=4 * hidden, attn_implementation="sdpa", **config)
    return BertModel(bert_config).to(device=device, dtype=dtype).eval()


FAMILY_TYPES = ("bert", "roberta", "electra", "distilbert", "albert", "deberta-v2", "modernbert")  # one per family
DEBERTA_V3 = {"relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
              "pos_att_type": "p2c|c2p", "share_att_key": True, "position_biased_input": False,
              "norm_rel_ebd": "layer_norm", "type_vocab_size": 0}  # deberta-v3-base's attention settings


def random_encoder(family: str, shape: str, device: torch.device, dtype: torch.dtype = torch.float32):
    """A model of ``family`` (a ``model_type``) in the named shape with random weights, SDPA attention (DeBERTa: its
    own), eval mode."""
    if family == "bert":
        return random_bert(shape, device, dtype)
    torch.manual_seed(0)
    layers, heads, hidden, _, _ = SHAPES[shape]
    fields = ({"n_layers": layers, "n_heads": heads, "dim": hidden, "hidden_dim": 4 * hidden} if family == "distilbert"
              else {"num_hidden_layers": layers, "num_attention_heads": heads, "hidden_size": hidden,
                    "intermediate_size": 4 * hidden})
    if family == "deberta-v2":  # its own attention: the stock model is eager (it has no other)
        config = AutoConfig.for_model(family, **fields, **DEBERTA_V3)
        return AutoModel.from_config(config).to(device=device, dtype=dtype).eval()
    config = AutoConfig.for_model(family, **fields, attn_implementation="sdpa")
    return AutoModel.from_config(config).to(device=device, dtype=dtype).eval()


def clock(device: torch.device) -> float:
    """Seconds, after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def alternating_rounds(runs: dict, rounds: int, repeat: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per call of each of ``runs`` (name -> function): every round times each ``repeat`` times in a row,
    the order reversed every other round, after two warm-up calls each."""
    for run in runs.values():
        run(), run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name in list(runs) if round_ % 2 == 0 else list(reversed(runs)):
            start = clock(device)
            for _ in range(repeat):
                runs[name]()
            times[name].append((clock(device) - start) / repeat)
    return times


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"
