"""Fine-tuning entry point (thin): ``python train.py model=minilm``."""

import hydra
from omegaconf import DictConfig

from headlab.config import register_resolvers
from headlab.runs import run_train

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    run_train(cfg)


if __name__ == "__main__":
    main()
