"""Fine-tuning entry point (thin): ``python train.py model=minilm task=demo_qa``."""

import hydra
from omegaconf import DictConfig

from headlab.cli.errors import exits_on_user_error, run_entry
from headlab.cli.schema import register_configs
from headlab.cli.train import run_train

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exits_on_user_error
def main(cfg: DictConfig) -> None:
    run_train(cfg)


if __name__ == "__main__":
    run_entry(main)
