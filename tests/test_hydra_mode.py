"""The config composed once per command (``headlab.cli.hydra_mode``): the mode Hydra would read from the config is
still read wherever a config can set it."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, run

from headlab.cli.hydra_mode import may_set_mode


@pytest.mark.parametrize(("overrides", "expected"), [
    (["model=tiny_random", "hydra.run.dir=x", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], False),
    (["experiment=guan2020_table2"], True), (["+experiment=mine"], True), (["hydra.mode=RUN"], True),
    (["~experiment"], True), (["experiment/x=y"], True), (["mode=eval", "seed=1"], False), ([], False)])
def test_only_an_experiment_or_hydra_mode_can_set_the_mode(overrides, expected):
    assert may_set_mode(overrides) == expected


def test_only_the_experiment_presets_set_hydra_mode():
    """What ``may_set_mode`` relies on: no config outside conf/experiment/ sets ``hydra.mode``."""
    setting = set()
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        if isinstance(config.get("hydra"), dict) and "mode" in config["hydra"]:
            setting.add(path.relative_to(ROOT / "conf").parts[0])
    assert setting == {"experiment"}


def test_a_preset_that_sets_multirun_still_launches_a_sweep_without_m(tmp_path):
    """``experiment=guan2020_table2`` (``hydra.mode: MULTIRUN``) without ``-m``: Hydra launches its 11 plans; they
    fail at once here (the clusters are not named by Guan et al.'s types), which is all this test needs."""
    clusters = tmp_path / "clusters.json"
    clusters.write_text(json.dumps({"labels": {f"L{layer}H{head}": f"cluster{head % 2}" for layer in range(3)
                                               for head in range(4)}, "shape": [3, 4]}))
    result = run("ablate.py", "experiment=guan2020_table2", "allow_random_head=true", f"mask.clusters={clusters}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd_tmp=tmp_path, check=False)
    assert result.returncode == 2 and "Launching 11 jobs locally" in result.stdout + result.stderr
