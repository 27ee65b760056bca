"""Shared fixtures: the tiny random BERT of conf/model/tiny_random.yaml and padded batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from headlab.core.models import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "Dr. Smith paid 3.5 million. He left! Then she said no.",
    "The city is old. It was born in 1931.",
    "Who was the doctor?",
]
PAIRS = [
    "Where did he go? To the river.",
    "Is it old?",
    "The doctor was Smith. He lives in the town.",
]


def compose_train(*overrides):
    """conf/train.yaml on the tiny random BERT, composed without running anything."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["model=tiny_random", *overrides])


@pytest.fixture(scope="session")
def tiny_cfg():
    return OmegaConf.load(ROOT / "conf/model/tiny_random.yaml")


@pytest.fixture(scope="session")
def tokenizer(tiny_cfg):
    return load_tokenizer(tiny_cfg)


@pytest.fixture
def tiny_model(tiny_cfg):
    return load_model(tiny_cfg)


@pytest.fixture
def encoding(tokenizer):
    """A padded batch of text pairs with offsets (rows have different lengths)."""
    return tokenizer(TEXTS, PAIRS, padding=True, return_offsets_mapping=True, return_tensors="pt")


@pytest.fixture
def inputs(encoding):
    assert (encoding["attention_mask"] == 0).any(), "the batch must contain padding"
    return {k: encoding[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture
def sentence_ids(inputs):
    """Caller-given unit ids: three units per row in blocks, arbitrary (non-contiguous) integers."""
    batch, n = inputs["input_ids"].shape
    ids = torch.tensor([[7, 7, 7, 2, 2, 2, 9, 9] * (n // 8 + 1)])[:, :n].repeat(batch, 1)
    ids[1] = torch.arange(n) // 3  # row 1: short units
    return ids


def assert_close_rel(actual, expected, rtol=1e-5):
    """``actual`` equals ``expected`` to ``rtol`` relative to the magnitude of ``expected``."""
    expected = expected.double()
    scale = expected.abs().max().clamp(min=1.0)
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=rtol * scale)
