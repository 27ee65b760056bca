"""The layer inputs a head sweep keeps between its layer passes (``analysis/evaluation/layer_inputs.py``): taken once,
for the layer they were kept for, within a byte budget, and a batch of other tokens is an error."""

from __future__ import annotations

import pytest
import torch

from headlab.analysis.evaluation.layer_inputs import LayerInputs


def hidden(rows: int = 2, seq: int = 3) -> torch.Tensor:
    return torch.randn(rows, seq, 4)  # [batch, seq, hidden]: 4 bytes * 4 per token


def test_an_input_is_taken_once_and_for_its_layer_only():
    inputs, first, second = LayerInputs(), hidden(), hidden()
    inputs.keep(1, (0, 0), first)
    inputs.keep(1, (0, 1), second)
    assert inputs.used == first.nbytes + second.nbytes
    assert inputs.take(1, (0, 0)) is first
    assert inputs.take(1, (0, 0)) is None  # taken
    assert inputs.take(2, (0, 1)) is None  # kept for layer 1: the pass of layer 1 did not run (a resumed sweep)
    assert inputs.take(1, (0, 1)) is None and inputs.used == 0  # and dropped, not kept for later


def test_batches_past_the_budget_are_not_kept():
    one = hidden()
    inputs = LayerInputs(budget=2 * one.nbytes)
    for batch in range(3):
        assert inputs.has_room() == (batch < 2)
        inputs.keep(1, (0, batch), hidden())
    assert inputs.used == 2 * one.nbytes
    assert inputs.take(1, (0, 2)) is None  # past the budget: that batch runs the layers below again
    newer = hidden()
    inputs.keep(1, (0, 0), newer)  # a batch keeps one tensor: the new one replaces the old
    assert inputs.used == 2 * one.nbytes and not inputs.has_room()
    assert inputs.take(1, (0, 0)) is newer
    assert inputs.has_room()  # a taken batch frees its bytes


def test_the_cpu_budget_is_set_from_the_first_kept_tensor():
    inputs = LayerInputs()
    inputs.keep(1, (0, 0), hidden())
    assert inputs.budget == 2 * 2**30


def test_a_batch_of_other_tokens_is_an_error():
    inputs = LayerInputs()
    inputs.keep(1, (0, 0), hidden(2, 3))
    with pytest.raises(RuntimeError, match=r"batch \(0, 0\): kept input \(2, 3, 4\) for \(2, 5\) tokens"):
        inputs.take(1, (0, 0), torch.Size([2, 5]))
