"""Analysis entry point (thin): ``python ablate.py mode=demo model=minilm mask=prune mask.heads=L0``."""

import hydra
from omegaconf import DictConfig

from headlab.config import register_resolvers
from headlab.runs import run_ablate

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="ablate")
def main(cfg: DictConfig) -> None:
    run_ablate(cfg)


if __name__ == "__main__":
    main()
