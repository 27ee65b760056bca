"""Optimal ablation (Li & Janson 2024): the constants learned by ``constant_training`` against the closed-form
minimiser on a BERT set by hand (tests/planted.py), the gap against mean ablation's on held-out data, and
``mode=gates gates.method=optimal`` end to end: its constants file and gaps reproduced by ``mode=eval``."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run
from planted import MASK, MODEL, TASK, planted_batches, planted_model
from torch.utils.data import DataLoader, DistributedSampler

from headlab.analysis.gates.constant_training import constant_module, row_heads
from headlab.core.patch.ablate import ablate
from headlab.core.plans import HeadPlan
from headlab.core.substitutes.means import head_means

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def fit_constants(model, batch, start, steps=500, lr=0.01):
    """The constants fit by a real Lightning fit, every example in the batch three times (once per head: row i of a
    step replaces head i mod 3), so every step is the whole objective of every head."""
    rows = {key: value.repeat_interleave(3, 0) for key, value in batch.items()}
    module = constant_module(MODEL, TASK, MASK, {}, {"method": "optimal", "lr": lr}, model, start).double()
    pl.seed_everything(0)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu", limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader([rows], batch_size=None))
    return module.constants.detach()


def test_the_learned_constant_is_the_closed_form_minimiser_of_the_loss():
    """The planted model without its noise head: with head 0 (the label head) replaced by a constant c, the [CLS]
    vector is [u, -u, 0, 0, K, -K] with u = 5 c_0, the pooler gives p = tanh(2 LayerNorm(.)_0) and the logits are
    (-4p, 4p). The cross-entropy over examples whose label-1 share is pi is least where sigmoid(8p) = pi, so
    p* = logit(pi) / 8, LayerNorm(.)_0 = atanh(p*) / 2 = h, and u = h K / sqrt(3 - h^2): c_0* = u / 5. Coordinates
    nothing reads keep their start (the means), and so do the heads that write nothing."""
    model = planted_model(noise=0.0).double()
    batch = planted_batches(96, batch_size=96)[0]
    start = torch.as_tensor(head_means(model, [{k: batch[k] for k in INPUTS}]).values)
    constants = fit_constants(model, batch, start)
    pi = float(batch["labels"].double().mean())
    h = math.atanh(math.log(pi / (1 - pi)) / 8) / 2
    expected = h * 3.0 / math.sqrt(3 - h * h) / 5.0
    assert abs(pi - 0.5) > 0.02 and abs(expected - float(start[0, 0, 0])) > 1e-2  # the fit has somewhere to go
    assert float(constants[0, 0, 0]) == pytest.approx(expected, abs=1e-9)
    torch.testing.assert_close(constants[0, 0, 1], start[0, 0, 1], rtol=0, atol=1e-6)  # not read
    torch.testing.assert_close(constants[0, 1:], start[0, 1:], rtol=0, atol=1e-6)  # heads that write nothing


def test_the_optimal_gap_is_below_the_mean_gap_on_held_out_data():
    """Each head replaced by its learned constant costs no more loss than replaced by its mean, on sentences the
    constants never saw (the planted model with its noise head: the noise head's constant removes the noise)."""
    model = planted_model().double()
    fit, held_out = planted_batches(96, batch_size=96, seed=1)[0], planted_batches(256, batch_size=256, seed=7)[0]
    start = torch.as_tensor(head_means(model, [{k: fit[k] for k in INPUTS}]).values)
    constants = fit_constants(model, fit, start)

    def loss(head, values):
        plan = HeadPlan.from_rules([{"heads": f"L0H{head}", "policy": "optimal"}], 1, 3)
        with torch.no_grad(), ablate(model, plan, constants=values):
            return float(model(**held_out).loss)

    with torch.no_grad():
        full = float(model(**held_out).loss)
    for head in range(3):
        optimal, mean = loss(head, constants) - full, loss(head, start) - full
        assert optimal <= mean + 1e-9, (head, optimal, mean)
    assert loss(1, constants) < full - 0.3  # the noise head's constant is a better head than the noise
    assert loss(0, constants) - full > 0.3  # the label head: no constant carries the label


def test_mode_gates_optimal_writes_constants_that_mode_eval_reproduces(trained, tmp_path):
    """The job's constants file, its gaps reproduced head by head: the optimal gap by mode=eval mask=optimal with the
    file, the mean gap by mode=eval mask=mean over the same training examples (mask.reference=train)."""
    root, _ = trained
    out, checkpoint = tmp_path / "optimal", f"ckpt_path={root / 'train'}"
    run("ablate.py", "mode=gates", "gates.method=optimal", "gates.max_steps=30", "gates.max_examples=64",
        "data.batch_size=16", "gates.checkpoint_every=10", "report.resamples=200", "report.permutations=200",
        checkpoint, f"hydra.run.dir={out}", cwd_tmp=root)
    record = json.loads((out / "constants.json").read_text())
    assert record["kind"] == "optimal_constants" and record["model"] == "tiny_random" and record["shape"][:2] == [3, 4]
    fit = json.loads((out / "fits/optimal/fit.json").read_text())
    np.testing.assert_array_equal(np.array(record["constants"]), np.array(fit["parameters"]))
    heads = pd.read_csv(out / "heads.csv")
    assert len(heads) == 12 and set(heads["split"]) == {"validation"}
    for head in ("L1H2",):
        row = heads[heads["head"] == head].iloc[0]
        gaps = {}
        for policy, extra in (("optimal", [f"mask.constants={out / 'constants.json'}"]),
                              ("mean", ["mask.reference=train", "mask.reference_examples=64"])):
            folder = tmp_path / f"{policy}_{head}"
            run("ablate.py", "mode=eval", f"mask={policy}", f"mask.heads={head}", *extra, checkpoint,
                f"hydra.run.dir={folder}", cwd_tmp=root)
            result = json.loads((folder / "results.json").read_text())
            gaps[policy] = result["delta"]["validation"]["loss"]
        # the job replays the layer (mode=sweep_heads' code), mode=eval runs whole forwards: float32 apart
        assert row["optimal_gap"] == pytest.approx(gaps["optimal"], abs=1e-6)
        assert row["mean_gap"] == pytest.approx(gaps["mean"], abs=1e-6)
        assert row["difference"] == pytest.approx(gaps["optimal"] - gaps["mean"], abs=2e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_processes_pair_each_example_with_the_head_one_process_pairs_it_with(world):
    """Process r of w gets rows r, r + w, ... of every step's w x b (torch's DistributedSampler, which the training
    sampler is); ``row_heads`` pairs each example with the head that one process of batch w x b pairs it with, over
    two epochs whose last steps are short (30 examples, batches of 4 per process, 27 heads)."""
    def pairs(processes: int, batch: int) -> dict[tuple[int, int], int]:
        found, step = {}, 0
        for epoch in range(2):
            shares = []
            for rank in range(processes):
                sampler = DistributedSampler(range(30), num_replicas=processes, rank=rank, shuffle=True, seed=5)
                sampler.set_epoch(epoch)
                shares.append(list(sampler))
            for start in range(0, len(shares[0]), batch):
                for rank, share in enumerate(shares):
                    rows = share[start:start + batch]
                    for example, head in zip(rows, row_heads(step, batch, processes, rank, len(rows), 27).tolist()):
                        found[epoch, example] = head
                step += 1
        return found

    one = pairs(1, 4 * world)
    assert len(one) == 60 and len(set(one.values())) == 27
    assert pairs(world, 4) == one
