"""The gated task module (``analysis.gates.gate_training``): its training objective and its gradient by the gates,
against the model's own float64 forward with each head's context times a hard concrete draw written in the test
(tests/families.py ``reference_of``), and the deterministic gates in evaluation."""

from __future__ import annotations

import math

import lightning.pytorch
import pytest
import torch
from conftest import PAIRS, TEXTS, compose_train
from families import reference_of

from headlab.analysis.gates.gate_training import gated_module
from headlab.cli.schema import register_configs

register_configs()
GATES = {"method": "l0", "l0_lambda": 0.3, "init": 0.4, "train_model": False, "lr": 0.1}


@pytest.fixture(scope="module")
def gated(tokenizer):
    cfg = compose_train("task=demo_pairs")
    module = gated_module(cfg.model, cfg.task, cfg.mask, cfg.optim, GATES).double()
    with torch.no_grad():  # gates that differ by head, some closed at test time
        module.gate_logits.copy_(torch.linspace(-3.0, 3.0, module.gate_logits.numel()).view_as(module.gate_logits))
    batch = dict(tokenizer(TEXTS, PAIRS, padding=True, return_tensors="pt"), labels=torch.tensor([1, 0, 1]))
    return module, batch


def reference_logits(module, batch, gates: torch.Tensor) -> torch.Tensor:
    """The classifier's logits with every head's context times ``gates`` ``[layers, heads]``, by definition."""
    expanded = gates.expand(len(batch["input_ids"]), *gates.shape)
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    with reference_of(module.model, lambda depth, head: "keep", None, False,
                      toward=("keep", expanded, torch.zeros_like(expanded))) as reference:
        return reference(**inputs).logits


def test_the_objective_is_the_task_loss_plus_lambda_times_the_expected_open_gates(gated):
    module, batch = gated
    module.train()
    assert not module.model.training and module.training  # a frozen model runs without dropout
    objective = module.training_loss(batch, module(batch))
    mine, = torch.autograd.grad(objective, [module.gate_logits])
    log_alpha = module.gate_logits.detach().clone().requires_grad_(True)
    u = module.step_noise()  # the step's uniform noise, and Louizos et al.'s draw written out
    torch.manual_seed(11)  # the global random state does not move it: (seed, step) alone
    torch.testing.assert_close(module.step_noise(), u, rtol=0, atol=0)
    assert float(u.min()) >= 1e-6 and float(u.max()) <= 1 - 1e-6 and len(set(u.flatten().tolist())) == u.numel()
    s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / (2 / 3))
    z = (s * 1.2 - 0.1).clamp(0, 1)
    task_loss = torch.nn.functional.cross_entropy(reference_logits(module, batch, z), batch["labels"])
    expected = task_loss + 0.3 * torch.sigmoid(log_alpha - (2 / 3) * math.log(0.1 / 1.1)).sum()
    gradient, = torch.autograd.grad(expected, [log_alpha])
    assert float(objective.detach()) == pytest.approx(float(expected.detach()), rel=1e-10)
    torch.testing.assert_close(mine, gradient, rtol=1e-8, atol=1e-12)
    assert ((z > 0) & (z < 1)).any() and (z == 0).any()  # the draw has open, partial and closed gates
    assert all(p.grad is None and not p.requires_grad for p in module.model.parameters())  # only the gates train


def test_evaluation_uses_the_deterministic_gates(gated):
    module, batch = gated
    module.eval()
    with torch.no_grad():
        logits = module(batch).logits
        gates = (torch.sigmoid(module.gate_logits) * 1.2 - 0.1).clamp(0, 1)
        torch.testing.assert_close(logits, reference_logits(module, batch, gates), rtol=1e-10, atol=1e-12)
        assert (gates == 0).any() and (gates == 1).any()


# On a model whose heads have known roles (tests/planted.py): L0 gates keep the label head and close the others.

def fit_planted(gates: dict, steps: int = 200, start=None):
    """A gated module over the planted model, its gates fit by a real Lightning fit on 512 sentences (from the logits
    ``start``)."""
    import lightning.pytorch as pl
    from planted import MASK, MODEL, TASK, planted_batches, planted_model
    from torch.utils.data import DataLoader

    module = gated_module(MODEL, TASK, MASK, {}, gates, planted_model(), start)
    pl.seed_everything(0)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu", limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader(planted_batches(512), batch_size=None))
    return module


def test_the_planted_heads_carry_the_label_add_noise_and_write_nothing():
    """The ground truth itself: accuracy with each head's context kept (1) or removed (0)."""
    from planted import planted_batches, planted_model

    from headlab.core.patch.ablate import ablate
    from headlab.core.plans import HeadPlan

    model, batches = planted_model(), planted_batches(512)

    def accuracy(gates):
        with torch.no_grad(), ablate(model, HeadPlan.keep_all(1, 3), gates=torch.tensor([gates])):
            return float(torch.cat([model(**b).logits.argmax(-1) == b["labels"] for b in batches]).float().mean())

    assert accuracy([1.0, 0.0, 1.0]) == accuracy([1.0, 0.0, 0.0]) == 1.0  # head 0 alone is always right
    assert 0.6 < accuracy([1.0, 1.0, 1.0]) < 0.8  # head 1's noise costs about a third of the answers
    assert accuracy([0.0, 1.0, 1.0]) < 0.6  # without head 0, about chance


@pytest.mark.parametrize("penalty", [0.01, 0.1])
def test_l0_gates_keep_the_label_head_and_close_the_noise_and_the_silent_head(penalty):
    module = fit_planted({"method": "l0", "l0_lambda": penalty, "init": 0.0, "lr": 0.1, "train_model": False})
    gates = (torch.sigmoid(module.gate_logits.detach().double()) * 1.2 - 0.1).clamp(0, 1)  # Louizos et al.'s test gate
    assert gates.tolist() == [[1.0, 0.0, 0.0]], module.gate_logits


def test_without_a_penalty_only_the_noise_head_closes():
    """lambda 0: the task loss alone closes head 1 (it hurts) and opens head 0; head 2 changes no output, so no
    gradient moves its gate from where it started (half open): closing what does nothing is the penalty's work."""
    module = fit_planted({"method": "l0", "l0_lambda": 0.0, "init": 0.0, "lr": 0.1, "train_model": False})
    gates = (torch.sigmoid(module.gate_logits.detach().double()) * 1.2 - 0.1).clamp(0, 1)
    assert gates[0, 0] == 1.0 and gates[0, 1] == 0.0 and float(module.gate_logits[0, 2]) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_causal_head_gating_calls_the_heads_facilitating_interfering_and_irrelevant(seed):
    """Nam et al.'s protocol on the planted model: a free fit from uniform gates, then from it one fit pushed toward
    retention (G+) and one toward removal (G-); the label head keeps both high, the noise head both low, the silent
    head goes where it is pushed."""
    from headlab.analysis.gates.chg_run import head_classes, uniform_logits

    def stage(weight, start):
        chg = {"method": "chg", "chg_lambda": weight, "lr": 1.0, "train_model": False}
        return fit_planted(chg, steps=100, start=start).gate_logits.detach().double()

    free = stage(0.0, torch.as_tensor(uniform_logits(seed, (1, 3))))
    retain, remove = torch.sigmoid(stage(0.1, free)), torch.sigmoid(stage(-0.1, free))
    classes = head_classes(retain.numpy(), remove.numpy(), 0.5)
    assert classes.tolist() == [["facilitating", "interfering", "irrelevant"]], (retain, remove)


def test_the_chg_objective_is_the_task_loss_minus_lambda_times_the_mean_clipped_logit(gated):
    """The regulariser written out: - lambda x mean(clamp(logits, -4, 4)); the gates are the logits' sigmoid in
    training and in evaluation."""
    module, batch = gated
    chg = gated_module(module.model_cfg, module.task, module.mask, module.optim,
                       {"method": "chg", "chg_lambda": -0.3, "lr": 1.0, "train_model": False}, module.model,
                       module.gate_logits.detach() * 2)  # logits -6 .. 6: some beyond the clip
    chg.train()
    objective = chg.training_loss(batch, chg(batch))
    mine, = torch.autograd.grad(objective, [chg.gate_logits])
    logits = chg.gate_logits.detach().clone().requires_grad_(True)
    task_loss = torch.nn.functional.cross_entropy(reference_logits(chg, batch, torch.sigmoid(logits)), batch["labels"])
    expected = task_loss + 0.3 * logits.clamp(-4, 4).mean()
    gradient, = torch.autograd.grad(expected, [logits])
    assert float(objective.detach()) == pytest.approx(float(expected.detach()), rel=1e-10)
    torch.testing.assert_close(mine, gradient, rtol=1e-8, atol=1e-12)
    assert (logits.abs() > 4).any()
    chg.eval()
    with torch.no_grad():
        torch.testing.assert_close(chg(batch).logits, reference_logits(chg, batch, torch.sigmoid(logits)),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["l0", "chg", "optimal"])
def test_each_method_trains_on_every_family(method):
    """A Lightning step of each method's module on every family's tiny classifier (ALBERT per depth, DeBERTa's
    hooks, ModernBERT's windows): the learned parameters move, the model's do not (the objective and its gradient
    against the float64 reference: the tests above, and tests/test_families.py per family)."""
    import lightning.pytorch as pl
    from families import CONFIGS, MODEL_TYPES, batch, tiny_model
    from torch.utils.data import DataLoader
    from transformers import AutoModelForSequenceClassification

    from headlab.analysis.gates.constant_training import constant_module

    for name in CONFIGS:
        model = tiny_model(name, AutoModelForSequenceClassification)
        config = {"model_type": MODEL_TYPES.get(name, name), **CONFIGS[name]}
        model_cfg = {"name": name, "random_init": True, "config": config}
        rows = batch()
        data = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"],
                "labels": torch.tensor([1, 0, 1])}
        before = {k: v.clone() for k, v in model.state_dict().items()}
        layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
        if method == "optimal":
            width = model.config.hidden_size // heads
            module = constant_module(model_cfg, TASK_OF_FAMILY, MASK_OF_FAMILY, {}, {"method": method, "lr": 0.1},
                                     model, torch.zeros(layers, heads, width))
        else:
            settings = {"method": method, "l0_lambda": 0.1, "chg_lambda": 0.1, "lr": 0.1, "train_model": False}
            module = gated_module(model_cfg, TASK_OF_FAMILY, MASK_OF_FAMILY, {}, settings, model)
        parameter = "constants" if method == "optimal" else "gate_logits"
        start = getattr(module, parameter).detach().clone()
        watch = ModelModes()
        trainer = pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, accelerator="cpu", limit_val_batches=0, callbacks=[watch])
        trainer.fit(module, train_dataloaders=DataLoader([data], batch_size=None))
        assert (getattr(module, parameter).detach() != start).any(), name
        assert watch.training == [False], name  # Lightning keeps modes: the module put its frozen model in eval mode
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), name


class ModelModes(lightning.pytorch.Callback):
    """Whether any of the module's model's modules was in training mode (dropout on) at each training batch."""

    def __init__(self):
        self.training = []

    def on_train_batch_start(self, trainer, module, *_):
        self.training.append(any(m.training for m in module.model.modules()))


TASK_OF_FAMILY = {"name": "pairs", "type": "classification", "num_labels": 2, "eval_splits": ["validation"],
                  "metrics": ["accuracy"], "main_metric": "accuracy"}
MASK_OF_FAMILY = {"rules": [], "unit": "sentence", "renormalize": False}
