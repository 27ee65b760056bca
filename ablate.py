"""Analysis entry point (thin): ``python ablate.py mode=demo model=minilm mask=prune mask.heads=L0``."""

import sys

import hydra
from omegaconf import DictConfig

from headlab.cli.ablate import run_ablate
from headlab.cli.errors import exits_on_user_error, run_entry
from headlab.cli.schema import register_configs
from headlab.study.schema import open_stage_settings

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="ablate")
@exits_on_user_error
def main(cfg: DictConfig) -> None:
    run_ablate(cfg)


if __name__ == "__main__":
    sys.argv = open_stage_settings(sys.argv)
    run_entry(main)
