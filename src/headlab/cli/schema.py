"""Typed configs: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` give the values, these give the shapes. Hydra checks types while
it composes (``seed=abc``, ``logger.offline=maybe``, ``optim.lr=abc`` and unknown keys fail
there); ``check_config`` then checks the values that come from a fixed set or a range
(``mask.unit=word``, ``trainer.precision=bf17``, ``optim.warmup_ratio=2``) in each dataclass's
``__post_init__``, before anything loads. Both end as one ``error:`` line (``headlab.cli.errors``).

Group files pick their schema in their defaults list (``- /schema/task/classification@_here_``);
``train`` and ``ablate`` are the top-level schemas of ``conf/train.yaml`` and ``conf/ablate.yaml``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from headlab.analysis.evaluation.report_schema import ReportConfig
from headlab.analysis.gates.schema import GatesConfig
from headlab.analysis.importance.schema import ImportanceConfig, PruneCurveConfig
from headlab.analysis.patching.schema import PatchConfig
from headlab.analysis.shapley.schema import ShapleyConfig
from headlab.analysis.syntax.schema import SyntaxConfig
from headlab.analysis.types.schema import ClusterConfig, CompareConfig, FeaturesConfig
from headlab.cli.hydra_glue import register_resolvers
from headlab.cli.logger_schema import CSVLoggerConfig, NoLoggerConfig, WandbLoggerConfig
from headlab.cli.trainer_schema import TrainerConfig
from headlab.core.plans import MEAN_OVER, POLICIES, UNITS
from headlab.errors import UserError, at_least, check_seed, not_a_file, one_of, within
from headlab.requirements import require_torch
from headlab.study.schema import StudyConfig
from headlab.tasks.hub_data import check_hub_dataset
from headlab.tasks.local_files import check_squad_file, check_text_file
from headlab.tasks.registry import METRICS, SQUAD_VERSIONS

ABLATE_MODES = ("study", "eval", "sweep_heads", "importance", "prune_curve", "shapley", "gates", "patch", "features",
                "cluster", "compare", "syntax", "report", "demo")
SWEEP_FAMILIES = ("single_head", "all_but_one", "layer", "random")
MAX_DRAWS = 100  # mask.resamples
DRAWS_WHY = (f"a forward takes the batch once per draw (with every layer's source heads at once), and {MAX_DRAWS} "
             "draws already average out which source an example takes to a tenth of one draw's spread (1/sqrt(draws))")
# --------------------------------------------------------------------------- groups


@dataclass
class ModelConfig:
    """``model/``: a checkpoint (hub name or folder), or a random BERT with ``config`` fields."""

    name: str = MISSING
    name_or_path: str | None = None
    pretraining: str | None = None  # how the checkpoint was trained, for a study's caveats (changes no result)
    random_init: bool = False
    seed: int = 0  # random_init: seed of the weights
    config: dict[str, Any] = field(default_factory=dict)  # random_init: BertConfig fields

    def __post_init__(self) -> None:
        check_seed("model.seed", self.seed)
        if not self.random_init and not self.name_or_path:
            raise UserError(f"model {self.name}: give model.name_or_path (hub name or folder), or random_init=true")
        if self.random_init and self.name_or_path:  # the folder's weights and tokenizer would be silently unread
            raise UserError(f"model {self.name}: model.name_or_path={self.name_or_path!r} is not read by a random "
                            "model (model.random_init=true); add model.random_init=false to load it, or leave it out")


@dataclass
class TaskConfig:
    """Fields every task has (``task/``)."""

    name: str = MISSING
    type: str = MISSING
    dataset: str | None = None  # hub dataset
    subset: str | None = None
    data_files: Any = None  # {split: local file} instead of the hub dataset (Any: Hydra cannot merge into a null dict)
    metrics: list[str] = MISSING
    main_metric: str = MISSING
    train_split: str = "train"
    eval_splits: list[str] = field(default_factory=lambda: ["validation"])
    max_length: int = 128

    def __post_init__(self) -> None:
        one_of("task.type", self.type, tuple(METRICS))
        for metric in self.metrics:
            one_of(f"task.metrics entry (task {self.name}, type {self.type})", metric, METRICS[self.type])
        one_of("task.main_metric", self.main_metric, list(self.metrics))
        if not self.eval_splits:
            raise UserError(f"task {self.name}: task.eval_splits is empty; name at least one split, e.g. [validation]")
        at_least("task.max_length", self.max_length, 8)
        if self.data_files and not isinstance(self.data_files, Mapping):
            raise UserError(f"task.data_files={self.data_files!r}: give a file per split, e.g. \"task.data_files="
                            f"{{{self.train_split}: train.csv, {self.eval_splits[0]}: dev.csv}}\" (quoted: the shell "
                            "reads braces)")
        if self.data_files:
            for split in [self.train_split, *self.eval_splits]:
                path = self.data_files.get(split)
                if path is None:
                    raise UserError(f"task.data_files has no {split!r} file; it has {list(self.data_files)}")
                if not Path(path).is_file():
                    raise UserError(f"task {self.name}: data file {path!r} for split {split!r} {not_a_file(path)}")
        elif not self.dataset:
            raise UserError(f"task {self.name}: give task.dataset (a hub dataset) or task.data_files (local files)")


@dataclass
class ClassificationTaskConfig(TaskConfig):
    """GLUE-style classification (``num_labels`` classes) or regression (one score)."""

    text_fields: list[str] = field(default_factory=lambda: ["sentence"])  # one field, or two for pairs
    label_field: str = "label"
    num_labels: int = 2
    # rows sharing this column's value were drawn together (a question's pairs): the statistics resample them as one
    # unit (headlab.reporting.sampled_units); null: each row is its own
    cluster_field: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("task.type", self.type, ("classification", "regression"))
        if len(self.text_fields) not in (1, 2):
            raise UserError(f"task.text_fields={list(self.text_fields)} must name one or two text columns")
        at_least("task.num_labels", self.num_labels, 1 if self.type == "regression" else 2)
        if self.data_files:
            for split in dict.fromkeys([self.train_split, *self.eval_splits]):
                check_text_file(self.data_files[split], self.name, list(self.text_fields), self.label_field,
                                self.cluster_field)
        if "f1" in self.metrics and self.num_labels != 2:
            raise UserError(f"task {self.name}: metric f1 is binary (F1 of class 1); task.num_labels={self.num_labels}")


@dataclass
class QuestionAnsweringTaskConfig(TaskConfig):
    """SQuAD-style extractive QA: windows of ``max_length`` tokens with ``doc_stride`` overlap."""

    version: str = "v1"
    max_length: int = 384
    doc_stride: int = 128
    n_best: int = 20
    max_answer_length: int = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("task.type", self.type, ("extractive_qa",))
        one_of("task.version", self.version, SQUAD_VERSIONS)
        at_least("task.doc_stride", self.doc_stride, 1)
        at_least("task.n_best", self.n_best, 1)
        at_least("task.max_answer_length", self.max_answer_length, 1)
        if self.doc_stride >= self.max_length:
            raise UserError(f"task.doc_stride={self.doc_stride} must be below task.max_length={self.max_length}")
        if self.data_files:
            for split in dict.fromkeys([self.train_split, *self.eval_splits]):
                check_squad_file(self.data_files[split], self.name, self.version)


@dataclass
class MaskConfig:
    """``mask/``: ordered ``rules``, or one ``policy`` on ``heads``; plan-level unit and renormalize."""

    rules: list[Any] | None = field(default_factory=list)  # [{heads: SELECTOR, policy: POLICY}, ...]
    policy: str | None = None
    heads: Any = None  # a selector string, or a list of them (a union)
    renormalize: bool = False
    unit: str = "sentence"
    clusters: str | None = None  # clusters JSON, for cluster:NAME
    importance: str | None = None  # importance JSON, for top:K / bottom:K
    importance_estimator: str | None = None  # which of the file's estimators top:/bottom: use (null: "importance")
    constants: str | None = None  # optimal: the constants file a mode=gates gates.method=optimal job writes
    reference: str = "validation"  # mean / resample: train | validation (the first eval split) | a data FILE
    reference_examples: int = 512  # the reference set: the first N examples of mask.reference
    mean_over: str = "tokens"  # mean: over every non-padding token, or per position (fixed-template inputs)
    resamples: int = 1  # resample: draws per example, their outputs averaged

    def __post_init__(self) -> None:
        one_of("mask.unit", self.unit, UNITS)
        if self.policy is not None:
            one_of("mask.policy", self.policy, POLICIES)
        one_of("mask.mean_over", self.mean_over, MEAN_OVER)
        at_least("mask.reference_examples", self.reference_examples, 1)
        within("mask.resamples", self.resamples, 1, MAX_DRAWS, DRAWS_WHY)


@dataclass
class DataConfig:
    """``data/``: batching, the tokenisation cache and quick-run limits."""

    batch_size: int = 32
    eval_batch_size: int = 64
    num_workers: int = 0
    cache_dir: str = ".cache/headlab"
    max_train_examples: int | None = None  # the first N training examples
    max_eval_examples: int | None = None  # the first N examples of each eval split

    def __post_init__(self) -> None:
        at_least("data.batch_size", self.batch_size, 1)
        at_least("data.eval_batch_size", self.eval_batch_size, 1)
        at_least("data.num_workers", self.num_workers, 0)
        at_least("data.max_train_examples", self.max_train_examples, 1, allow_none=True)
        at_least("data.max_eval_examples", self.max_eval_examples, 1, allow_none=True)


@dataclass
class OptimConfig:
    """``optim/``: AdamW with linear warm-up then linear decay to 0."""

    lr: float = 5e-5
    weight_decay: float = 0.01
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.1  # of all optimizer steps
    warmup_steps: int | None = None  # overrides warmup_ratio

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise UserError(f"optim.lr={self.lr} must be > 0")
        at_least("optim.weight_decay", self.weight_decay, 0)
        if not self.adam_eps > 0:
            raise UserError(f"optim.adam_eps={self.adam_eps} must be > 0")
        within("optim.warmup_ratio", self.warmup_ratio, 0, 1)
        at_least("optim.warmup_steps", self.warmup_steps, 0, allow_none=True)


# --------------------------------------------------------------------------- top level


@dataclass
class RunConfig:
    """What both entry scripts read: the model, task, plan, hardware, tracking and data."""

    model: ModelConfig = MISSING
    task: Any = MISSING  # a ClassificationTaskConfig or QuestionAnsweringTaskConfig
    mask: MaskConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: Any = MISSING
    data: DataConfig = MISSING
    seed: int = 0
    compile: bool = False  # torch.compile the model (fine-tuning and evaluation)
    paths_root: str | None = None  # set by the study on its jobs: paths inside it are hashed relative to it


@dataclass
class TrainConfig(RunConfig):
    """``conf/train.yaml``."""

    optim: OptimConfig = MISSING
    experiment: str = "finetune"  # the run's or sweep's name (conf/train.yaml: experiment=NAME)
    group: str = "finetune"  # W&B group (conf/train.yaml: the experiment)
    ckpt_path: str | None = None  # null (resume this job's last.ckpt if any), last, or a .ckpt path
    keep_training_state: bool = False  # keep checkpoints/*.ckpt whole once finished (to continue training later)


@dataclass
class DemoConfig:
    texts: list[str] = MISSING
    text_pairs: list[str] = MISSING
    plans: dict[str, Any] = field(default_factory=dict)  # name -> {rules, unit?, renormalize?}


MAX_RANDOM_SETS = 10_000  # sweep.draws: random sets per size


@dataclass
class SweepConfig:
    """``mode=sweep_heads``: which family of plans, each under ``mask.policy``."""

    family: str = "single_head"  # single_head: each head alone; all_but_one: per layer, all heads but one; layer;
                                 # random: sets of heads drawn at random (sizes, draws, seed)
    heads_per_batch: int = 0  # plans per batched forward (0: all of a layer's on GPU, one on CPU)
    sizes: list[int] = field(default_factory=list)  # family random: how many heads a set has (a control of a type's)
    draws: int = 20  # family random: sets drawn per size
    seed: int = 0  # family random: the draws' seed (each size's own stream)

    def __post_init__(self) -> None:
        one_of("sweep.family", self.family, SWEEP_FAMILIES)
        at_least("sweep.heads_per_batch", self.heads_per_batch, 0)
        within("sweep.draws", self.draws, 1, MAX_RANDOM_SETS, "a random set per draw and size, each a pass's plan")
        check_seed("sweep.seed", self.seed)
        twice = sorted({size for size in self.sizes if list(self.sizes).count(size) > 1})
        if twice:
            raise UserError(f"sweep.sizes={list(self.sizes)} names {', '.join(map(str, twice))} twice: give each size "
                            "once (sweep.draws sets how many sets of it)")
        if self.family == "random" and not self.sizes:
            raise UserError("sweep.family=random needs sweep.sizes=[N, ...]: how many heads each random set has")
        if self.family != "random" and self.sizes:
            raise UserError(f"sweep.sizes={list(self.sizes)} is read by sweep.family=random only; got "
                            f"sweep.family={self.family}")
        for size in self.sizes:
            at_least("sweep.sizes", size, 1)


@dataclass
class AblateConfig(RunConfig):
    """``conf/ablate.yaml``."""

    mode: str = "study"
    optim: OptimConfig = MISSING  # mode=gates gates.train_model=true: the model's optimizer, as train.py's
    group: str = "adhoc"  # the sweep's name: W&B group and sweep directory (the preset's name by default)
    ckpt_path: str | None = None  # .ckpt, train.py job directory, save_pretrained directory, or null
    allow_random_head: bool = False
    baseline_dir: str = "outputs/baselines"
    plan: str | None = None  # a name in ``plans``: its mask fields override ``mask``
    plans: dict[str, Any] = field(default_factory=dict)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    importance: ImportanceConfig = field(default_factory=ImportanceConfig)
    prune_curve: PruneCurveConfig = field(default_factory=PruneCurveConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    syntax: SyntaxConfig = field(default_factory=SyntaxConfig)
    shapley: ShapleyConfig = field(default_factory=ShapleyConfig)
    gates: GatesConfig = field(default_factory=GatesConfig)
    patch: PatchConfig = field(default_factory=PatchConfig)
    sweep_dir: str | None = None  # mode=report: the sweep directory to collect
    report: ReportConfig = field(default_factory=ReportConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    study: StudyConfig = field(default_factory=StudyConfig)


SCHEMAS = {
    "schema/task/classification": ClassificationTaskConfig,
    "schema/task/extractive_qa": QuestionAnsweringTaskConfig,
    "schema/logger/wandb": WandbLoggerConfig,
    "schema/logger/csv": CSVLoggerConfig,
    "schema/logger/none": NoLoggerConfig,
    "train_schema": TrainConfig,
    "ablate_schema": AblateConfig,
}
# Groups whose values are checked before anything loads (the logger is only typed: it reads Hydra's run dir).
CHECKED_GROUPS = ("model", "task", "mask", "trainer", "data", "optim", "sweep", "importance", "prune_curve", "features",
                  "cluster", "compare", "syntax", "shapley", "gates", "patch", "report")


def register_configs() -> None:
    """Resolvers and schemas; call before Hydra composes (the entry scripts do, at import)."""
    register_resolvers()
    store = ConfigStore.instance()
    for path, schema in SCHEMAS.items():
        group, _, name = path.rpartition("/")
        store.store(group=group or None, name=name, node=schema)


# options that were retired: what to do instead
RETIRED = {"attention_route": "the fused FlexAttention route was retired (on an H200 its drop_* forwards took 2.5-5.6x "
                              "stock attention's time, the SDPA route's 1.2x: BENCHMARKS.md); drop the option"}


def check_known_keys(cfg: Any) -> None:
    """Every top-level key is an option of the script: Hydra refuses an unknown ``key=value``, but ``+key=value``
    adds one, which nothing would read (a retired option, a typo)."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return
    known = {field.name for field in dataclasses.fields(schema)}
    for key in cfg:
        if key == "hydra":  # composed with Hydra's own node (tests)
            continue
        if key in RETIRED:
            raise UserError(f"{key}: {RETIRED[key]}")
        if key not in known:
            raise UserError(f"{key} is not an option here ('+{key}=...' added it): nothing would read it; remove it")


def read_from_pairs(cfg: Any) -> bool:
    """Whether the job reads its examples from ``patch.pairs`` alone (``mode=patch``): the task's hub data set, offline
    and not cached, is then not needed."""
    return OmegaConf.get_type(cfg) is AblateConfig and cfg.mode == "patch" and cfg.patch.pairs is not None


def check_config(cfg: Any) -> None:
    """Range and fixed-set checks of every group (``UserError``); types were checked by Hydra."""
    check_known_keys(cfg)
    for group in CHECKED_GROUPS:
        if group in cfg:
            OmegaConf.to_object(cfg[group])
    check_seed("seed", cfg.seed)
    task = cfg.get("task")
    if task is not None and not task.get("data_files") and not read_from_pairs(cfg):
        check_hub_dataset(task.name, task.dataset, task.get("subset"), list(task.eval_splits))
    for index, seed in enumerate(cfg.study.seeds if "study" in cfg else ()):
        check_seed(f"study.seeds[{index}]", seed)
    if OmegaConf.get_type(cfg) is AblateConfig:
        one_of("mode", cfg.mode, ABLATE_MODES)
    if cfg.get("compile"):
        require_torch("compile=true")
