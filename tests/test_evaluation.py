"""Evaluation under plans in-process: records, metrics recomputed from them, and head sweeps equal to separate
evaluations for every policy (tiny random BERT, demo tasks, padded batches)."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from conftest import ROOT
from hydra import compose, initialize_config_dir

from headlab.analysis.evaluation.layer_inputs import LayerInputs
from headlab.analysis.evaluation.sweep_heads import LayerSweepEvaluator
from headlab.analysis.evaluation.sweep_plans import family_plans
from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.cli.schema import register_configs
from headlab.core.models import load_model
from headlab.core.plans import HeadPlan
from headlab.tasks.metrics import squad_scores
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.datamodule import TaskDataModule
from headlab.training.modules import task_head

register_configs()


def setup(task: str, tmp_path, unit: str = "sentence", examples: int = 24, model: str = "tiny_random",
          max_length: int = 64, louder: float = 1.0):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("ablate", overrides=[f"model={model}", f"task={task}", f"task.max_length={max_length}",
                                           *(["task.doc_stride=16"] if task == "demo_qa" else [])])
    data = TaskDataModule(cfg.task, cfg.model, unit=unit, eval_batch_size=7, max_eval_examples=examples,
                          cache_dir=tmp_path / "cache", train=False)
    data.setup()
    torch.manual_seed(1)
    model = load_model(cfg.model, *task_head(cfg.task))
    with torch.no_grad():  # sharper attention than a fresh init's (near uniform), so every policy changes outputs
        for name, weight in model.named_parameters():
            if name.endswith(("query.weight", "key.weight", "q_lin.weight", "k_lin.weight", "Wqkv.weight",
                              "classifier.weight", "qa_outputs.weight")):
                weight.mul_(12)
            if name.endswith("attention.self.value.weight"):  # ``louder``: what a head passes on weighs more
                weight.mul_(louder)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    return cfg, data, model, trainer


def records_of(trainer, data, evaluator):
    trainer.validate(evaluator, datamodule=data, verbose=False)
    return evaluator.records


@pytest.mark.parametrize("task", ["demo_pairs", "demo_qa"])
def test_batches_by_length_give_every_example_its_file_order_records(task, tmp_path):
    """Evaluation batches rows of similar lengths (a question's windows together): every example's loss and
    prediction under each plan are those of the batches in file order, and the batches pad fewer tokens."""
    cfg, data, model, trainer = setup(task, tmp_path, examples=40, max_length=256)  # long enough to vary
    variants = [Variant("baseline", HeadPlan.keep_all(3, 4)),
                Variant("drop_inter", HeadPlan.from_rules([{"heads": "L1", "policy": "drop_inter"}], 3, 4)),
                Variant("uniform", HeadPlan.from_rules([{"heads": "H0-1", "policy": "uniform"}], 3, 4))]
    padded = {}
    records = {}
    for by_length in (False, True):
        data.by_length = by_length
        loader = data.eval_dataloader("validation")
        order = [int(i) for batch in loader for i in batch["example_index"]]
        padded[by_length] = sum(batch["input_ids"].numel() for batch in loader)
        records[by_length] = records_of(trainer, data, PlanEvaluator(model, cfg.task, variants, data.eval_examples))
    assert sorted(order) == sorted(np.asarray(data.eval_features["validation"]["example_index"]).tolist())
    assert order != sorted(order), "the rows must come in another order, or the comparison proves nothing"
    assert padded[True] < 0.9 * padded[False]
    for key, rows in records[False].items():
        mine = records[True][key]
        assert [r["example"] for r in mine] == [r["example"] for r in rows] == list(range(40))
        np.testing.assert_allclose([r["loss"] for r in mine], [r["loss"] for r in rows], rtol=1e-5, atol=1e-6)
        assert [r["prediction"] for r in mine] == [r["prediction"] for r in rows]


@pytest.mark.parametrize("task", ["demo_pairs", "demo_qa"])
@pytest.mark.parametrize(("policy", "renormalize"), [("prune", False), ("uniform", False), ("drop_intra", False),
                                                     ("drop_inter", False), ("drop_intra", True)])
def test_head_sweep_equals_separate_evaluations(task, policy, renormalize, tmp_path):
    # a classifier reads [CLS] alone, whose attention drop_* keep (special tokens are in every unit): what the other
    # tokens lose reaches it through the next layer's values, made louder here so that every plan moves the losses
    classifier_drop = policy.startswith("drop_") and task != "demo_qa"
    cfg, data, model, trainer = setup(task, tmp_path, louder=8.0 if classifier_drop else 1.0)
    plans = family_plans("single_head", policy, 3, 4)
    separate = records_of(trainer, data, PlanEvaluator(model, cfg.task, [
        Variant("baseline", HeadPlan.keep_all(3, 4)), *(Variant(n, p, renormalize) for n, _, p in plans)],
        data.eval_examples))
    swept, inputs = {}, LayerInputs()  # each layer's pass starts from the inputs the previous one kept
    for layer in range(3):
        variants = [Variant(n, p, renormalize) for n, l, p in plans if l == layer]
        baseline = Variant("baseline", HeadPlan.keep_all(3, 4)) if layer == 1 else None
        swept |= records_of(trainer, data, LayerSweepEvaluator(model, cfg.task, layer, variants, data.eval_examples,
                                                               per_forward=3, baseline=baseline, inputs=inputs))
    assert inputs.used == 0, "the last layer's pass keeps nothing"
    assert set(swept) == set(separate)
    for key, rows in separate.items():
        mine = swept[key]
        assert [r["example"] for r in mine] == [r["example"] for r in rows] == list(range(len(rows)))
        np.testing.assert_allclose([r["loss"] for r in mine], [r["loss"] for r in rows], rtol=2e-6, atol=1e-7)
        assert [r["prediction"] for r in mine] == [r["prediction"] for r in rows]
    base = np.array([r["loss"] for r in separate[("baseline", "validation")]])
    unmoved = {n for n, layer, _ in plans if layer == 2} if classifier_drop else set()  # last layer: [CLS] alone
    moved = [np.abs(np.array([r["loss"] for r in rows]) - base).max() for key, rows in separate.items()
             if key[0] != "baseline" and key[0] not in unmoved]
    assert min(moved) > 2e-5, "every ablation must change the losses, or the comparison proves nothing"


@pytest.mark.parametrize("model", ["tiny_distilbert", "tiny_roberta", "tiny_electra", "tiny_modernbert",
                                   "tiny_deberta"])
def test_head_sweep_on_other_model_families_equals_separate_evaluations(model, tmp_path):
    """The replayed contexts of a layer: DistilBERT's and ModernBERT's are the input of the projection inside their
    attention modules; ELECTRA's first layer follows a projection of the embeddings."""
    cfg, data, model, trainer = setup("demo_pairs", tmp_path, model=model)
    plans = family_plans("single_head", "prune", 3, 4)
    separate = records_of(trainer, data, PlanEvaluator(model, cfg.task, [
        Variant("baseline", HeadPlan.keep_all(3, 4)), *(Variant(n, p) for n, _, p in plans)], data.eval_examples))
    base = np.array([r["loss"] for r in separate[("baseline", "validation")]])
    inputs = LayerInputs()
    for layer in range(3):
        variants = [Variant(n, p) for n, l, p in plans if l == layer]
        swept = records_of(trainer, data, LayerSweepEvaluator(model, cfg.task, layer, variants, data.eval_examples,
                                                              per_forward=2, inputs=inputs))
        for variant in variants:
            key = (variant.name, "validation")
            losses = [r["loss"] for r in separate[key]]
            np.testing.assert_allclose([r["loss"] for r in swept[key]], losses, rtol=2e-6, atol=1e-7)
            assert np.abs(np.array(losses) - base).max() > 3e-6, key  # past the tolerance: the comparison can fail


@pytest.mark.parametrize("task", ["demo_pairs", "demo_qa"])
@pytest.mark.parametrize("policy", ["mean", "resample"])
def test_head_sweep_of_substituted_heads_equals_separate_evaluations(task, policy, tmp_path):
    """The means (and two resample draws per example, SQuAD windows taking their source's window) reach the replayed
    layer as they reach a whole forward; the resample sources are drawn once, the same for both."""
    from headlab.analysis.jobs.substitutes import JobSubstitutes

    cfg, data, model, trainer = setup(task, tmp_path)
    cfg.mask.reference_examples, cfg.mask.resamples, cfg.baseline_dir = 24, 2, str(tmp_path / "baselines")
    substitutes = JobSubstitutes(cfg, cfg.model, data, resample=policy == "resample")
    substitutes.model_key = "tiny"
    plans = family_plans("single_head", policy, 3, 4)
    separate = records_of(trainer, data, PlanEvaluator(model, cfg.task, [
        Variant("baseline", HeadPlan.keep_all(3, 4)), *(Variant(n, p) for n, _, p in plans)], data.eval_examples,
        substitutes))
    base = np.array([r["loss"] for r in separate[("baseline", "validation")]])
    for layer in range(3):
        variants = [Variant(n, p) for n, l, p in plans if l == layer]
        swept = records_of(trainer, data, LayerSweepEvaluator(model, cfg.task, layer, variants, data.eval_examples,
                                                              per_forward=3, substitutes=substitutes))
        for variant in variants:
            key = (variant.name, "validation")
            losses = [r["loss"] for r in separate[key]]
            np.testing.assert_allclose([r["loss"] for r in swept[key]], losses, rtol=2e-6, atol=1e-7)
            assert [r["prediction"] for r in swept[key]] == [r["prediction"] for r in separate[key]]
            assert np.abs(np.array(losses) - base).max() > 3e-6, key  # past the tolerance: the comparison can fail
            if policy == "resample":
                assert [r["sources"] for r in swept[key]] == [r["sources"] for r in separate[key]]
                assert all(len(r["sources"]) == 2 and r["example"] not in r["sources"] for r in swept[key])


@pytest.mark.parametrize("family", ["all_but_one", "layer"])
def test_other_families_equal_separate_evaluations(family, tmp_path):
    cfg, data, model, trainer = setup("demo_pairs", tmp_path)
    plans = family_plans(family, "uniform", 3, 4)
    assert len(plans) == (12 if family == "all_but_one" else 3)
    separate = records_of(trainer, data, PlanEvaluator(model, cfg.task, [Variant(n, p) for n, _, p in plans],
                                                       data.eval_examples))
    for layer in range(3):
        variants = [Variant(n, p) for n, l, p in plans if l == layer]
        swept = records_of(trainer, data, LayerSweepEvaluator(model, cfg.task, layer, variants, data.eval_examples))
        for variant in variants:
            key = (variant.name, "validation")
            np.testing.assert_allclose([r["loss"] for r in swept[key]], [r["loss"] for r in separate[key]],
                                       rtol=1e-5, atol=1e-6)


def test_family_plans_change_the_right_heads():
    by_name = {name: plan for name, _, plan in family_plans("all_but_one", "prune", 2, 3)}
    assert by_name["L1H2"].heads_with("prune") == [(1, 0), (1, 1)]
    assert [name for name, _, _ in family_plans("layer", "uniform", 2, 3)] == ["L0", "L1"]
    assert family_plans("single_head", "prune", 2, 3)[4][2].heads_with("prune") == [(1, 1)]


def test_classification_records_and_metrics_from_them(tmp_path):
    cfg, data, model, trainer = setup("demo_pairs", tmp_path, examples=30)
    rows = records_of(trainer, data, PlanEvaluator(model, cfg.task, [Variant("p", HeadPlan.from_rules(
        [{"heads": "L0", "policy": "prune"}], 3, 4))], data.eval_examples))[("p", "validation")]
    # An independent forward of each example alone: label, argmax and cross-entropy.
    raw = data.eval_examples["validation"]
    with torch.no_grad():
        for row, example in zip(rows, raw):
            enc = tokenizer_of(cfg)(example["sentence1"], example["sentence2"], truncation=True, max_length=64,
                                    return_tensors="pt")
            from headlab.core.patch.ablate import ablate

            with ablate(model, HeadPlan.from_rules([{"heads": "L0", "policy": "prune"}], 3, 4)):
                logits = model(**enc).logits[0].double()
            assert row["label"] == example["label"] and row["prediction"] == int(logits.argmax())
            assert row["loss"] == pytest.approx(float(torch.logsumexp(logits, 0) - logits[example["label"]]),
                                                rel=1e-5)
    label = np.array([r["label"] for r in rows])
    pred = np.array([r["prediction"] for r in rows])
    tp, fp = ((pred == 1) & (label == 1)).sum(), ((pred == 1) & (label == 0)).sum()
    fn = ((pred == 0) & (label == 1)).sum()
    metrics = metrics_from_records({k: [r[k] for r in rows] for k in rows[0]}, cfg.task)
    assert metrics["accuracy"] == pytest.approx((label == pred).mean())
    assert metrics["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    assert metrics["loss"] == pytest.approx(np.mean([r["loss"] for r in rows]))


def test_qa_records_score_each_question_once(tmp_path):
    cfg, data, model, trainer = setup("demo_qa", tmp_path, examples=20)
    rows = records_of(trainer, data, PlanEvaluator(model, cfg.task, [Variant("b", HeadPlan.keep_all(3, 4))],
                                                   data.eval_examples))[("b", "validation")]
    raw = data.eval_examples["validation"]
    assert [r["id"] for r in rows] == list(raw["id"])  # every question once, in order
    features = data.eval_features["validation"]
    assert len(features) > len(raw), "contexts must span several windows"
    for row, example in zip(rows, raw):
        exact, f1 = squad_scores(row["prediction"], example["answers"]["text"])
        assert (row["exact_match"], row["f1"]) == (exact, f1)
        assert row["prediction"] == "" or row["prediction"] in example["context"]
    metrics = metrics_from_records({k: [r[k] for r in rows] for k in rows[0]}, cfg.task)
    assert metrics["f1"] == pytest.approx(100 * np.mean([r["f1"] for r in rows]))


def tokenizer_of(cfg):
    from headlab.core.models import load_tokenizer

    return load_tokenizer(cfg.model)


def test_layer_sweep_refuses_plans_outside_its_layer_or_mixing_policies(tmp_path):
    cfg, data, model, _ = setup("demo_pairs", tmp_path, examples=4)
    other_layer = Variant("L2H0", HeadPlan.from_rules([{"heads": "L2H0", "policy": "prune"}], 3, 4))
    mixed = [Variant(n, p) for n, _, p in family_plans("single_head", "prune", 3, 4)[4:5]]
    mixed.append(Variant("u", HeadPlan.from_rules([{"heads": "L1H2", "policy": "uniform"}], 3, 4)))
    for variants in ([other_layer], mixed):
        with pytest.raises(ValueError, match="change only layer 1, with one policy"):
            LayerSweepEvaluator(model, cfg.task, 1, variants, data.eval_examples)


def _unpadded_span_losses(model, features) -> dict[int, list[float]]:
    """Each feature run alone (no padding) in float64: (cross-entropy of its start + of its end) / 2, by question;
    written from the definition, not with headlab's loss."""
    import copy

    model = copy.deepcopy(model).double().eval()
    losses: dict[int, list[float]] = {}
    for row in features:
        inputs = {k: torch.tensor([row[k]]) for k in ("input_ids", "attention_mask", "token_type_ids") if k in row}
        with torch.no_grad():
            out = model(**inputs)
        terms = [torch.logsumexp(logits[0], 0) - logits[0, row[name]]
                 for logits, name in ((out.start_logits, "start_positions"), (out.end_logits, "end_positions"))]
        losses.setdefault(row["example_index"], []).append(float(sum(terms)) / 2)
    return losses


def test_a_questions_loss_does_not_depend_on_the_questions_in_its_batch(tmp_path):
    """Padding positions once entered the span softmax: a question's loss moved with its batch's longest window.
    Batch sizes 1 and 7 give equal per-question losses, equal to the unpadded float64 computation, in the records
    (evaluation), in the gradients (importance: each feature's gate gradient) and in the training loss."""
    from headlab.core.importance import head_gradients
    from headlab.training.modules import task_module

    cfg, _, model, trainer = setup("demo_qa", tmp_path, examples=12)
    plans = [Variant("baseline", HeadPlan.keep_all(3, 4)),
             Variant("L0H0", HeadPlan.from_rules([{"heads": "L0H0", "policy": "prune"}], 3, 4))]
    records, gates = {}, {}
    for size in (1, 7):
        data = TaskDataModule(cfg.task, cfg.model, eval_batch_size=size, max_eval_examples=12,
                              cache_dir=tmp_path / "cache", train=False)
        data.setup()
        records[size] = records_of(trainer, data, PlanEvaluator(model, cfg.task, plans, data.eval_examples))
        loader = torch.utils.data.DataLoader(data.eval_features["validation"], batch_size=size,
                                             collate_fn=data.collator)
        gates[size] = head_gradients(model, loader, policies=()).gate  # [features, layers, heads]
    features = data.eval_features["validation"]
    assert len({len(ids) for ids in features["input_ids"]}) > 1, "windows of several lengths: batches get padding"
    reference = _unpadded_span_losses(model, features)
    baseline = [np.mean(reference[q]) for q in sorted(reference)]
    mine = {size: [r["loss"] for r in rows[("baseline", "validation")]] for size, rows in records.items()}
    np.testing.assert_allclose(mine[1], baseline, rtol=1e-5)
    np.testing.assert_allclose(mine[7], baseline, rtol=1e-5)
    for key in records[1]:
        np.testing.assert_allclose([r["loss"] for r in records[7][key]], [r["loss"] for r in records[1][key]],
                                   rtol=1e-5)
    np.testing.assert_allclose(gates[7], gates[1], rtol=1e-4, atol=1e-7)

    module = task_module(cfg.model, cfg.task, cfg.mask, {"lr": 1e-5, "weight_decay": 0.0, "adam_eps": 1e-8,
                                                         "warmup_ratio": 0.0})
    module.model.load_state_dict(model.state_dict())
    module.eval()
    batch = data.collator([features[i] for i in range(7)])
    with torch.no_grad():
        loss = module.training_loss(batch, module(batch))
    expected = np.mean([value for q in sorted(reference) for value in reference[q]][:7])
    assert float(loss) == pytest.approx(expected, rel=1e-5)
