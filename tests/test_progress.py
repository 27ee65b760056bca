"""Progress lines in logs without a live progress bar (training/progress.py), with real Lightning."""

import logging

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from headlab.training.progress import NamedPassBar, ProgressLines, ProgressLog, clock_time, counted_batches

LOGGER = "headlab.training.progress"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def messages(caplog):
    return [record.getMessage() for record in caplog.records if record.name == LOGGER]


@pytest.mark.parametrize(("seconds", "text"), [(0, "0:00"), (59.6, "1:00"), (75, "1:15"), (3725, "1:02:05")])
def test_clock_time(seconds, text):
    assert clock_time(seconds) == text


def test_a_line_per_interval_with_the_remaining_time_extrapolated(caplog):
    clock = Clock()
    progress = ProgressLines("features", 400, "sequences", interval=30, clock=clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.now += 29
        progress.update(50)  # before the interval: nothing
        clock.now += 1
        progress.update(100)  # 30 s for 100 of 400: 90 s left
        clock.now += 20
        progress.update(150)  # 20 s since the last line: nothing
        clock.now += 30
        progress.update(400)  # done: no time left to estimate
    assert messages(caplog) == ["features: 100/400 sequences (25%), 0:30 elapsed, about 1:30 left",
                                "features: 400/400 sequences (100%), 1:20 elapsed"]


def test_a_resumed_pass_extrapolates_from_what_this_process_did(caplog):
    clock = Clock()
    progress = ProgressLines("training", 2000, "steps", interval=60, clock=clock, done_before=1000)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.now += 60
        progress.update(1100)  # 100 steps a minute since the resume: 9 minutes for the last 900
    assert messages(caplog) == ["training: 1100/2000 steps (55%), 1:00 elapsed, about 9:00 left"]


@pytest.mark.parametrize("total", [None, float("inf")])
def test_an_unknown_total_says_how_many_and_how_long(caplog, total):
    clock = Clock()
    progress = ProgressLines("training", total, "steps", interval=10, clock=clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        clock.now += 65
        progress.update(7)
    assert messages(caplog) == ["training: 7 steps, 1:05 elapsed"]


def test_counted_batches_passes_batches_through_and_counts_sequences(caplog):
    batches = [{"input_ids": torch.zeros(size, 5, dtype=torch.long)} for size in (4, 4, 3)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        seen = list(counted_batches(batches, ProgressLines("features", 11, "sequences", interval=0)))
    assert seen == batches
    assert [m.split(" (")[0] for m in messages(caplog)] == ["features: 4/11 sequences", "features: 8/11 sequences",
                                                             "features: 11/11 sequences"]


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        features, target = batch
        return torch.nn.functional.mse_loss(self.layer(features), target)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        features, target = batch
        self.log("loss", torch.nn.functional.mse_loss(self.layer(features), target))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(size):
    generator = torch.Generator().manual_seed(size)
    return DataLoader(TensorDataset(torch.randn(size, 3, generator=generator), torch.randn(size, 1,
                                                                                        generator=generator)),
                      batch_size=2)


def test_lightning_passes_log_steps_and_batches_but_not_the_sanity_check(tmp_path, caplog):
    trainer = pl.Trainer(max_epochs=2, callbacks=[ProgressLog(interval=0)], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         num_sanity_val_steps=2, accelerator="cpu")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.fit(Regression(), train_dataloaders=loader(6), val_dataloaders=[loader(4), loader(2)])
    lines = [m.split(",")[0] for m in messages(caplog)]
    training = [line for line in lines if line.startswith("training")]
    validation = [line for line in lines if line.startswith("validation")]
    # 3 steps per epoch, 2 epochs; each validation: 2 + 1 batches over both loaders, the sanity check not counted
    assert training == [f"training: {step}/6 steps ({100 * step / 6:.0f}%)" for step in range(1, 7)]
    assert validation == [f"validation: {batch}/3 batches ({100 * batch / 3:.0f}%)" for batch in (1, 2, 3)] * 2
    trainer.save_checkpoint(tmp_path / "two_epochs.ckpt")
    caplog.clear()
    lines = ProgressLog(interval=0)
    resumed = pl.Trainer(max_epochs=3, callbacks=[lines], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         accelerator="cpu", limit_val_batches=0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        resumed.fit(Regression(), train_dataloaders=loader(6), ckpt_path=tmp_path / "two_epochs.ckpt")
    assert [m.split(",")[0] for m in messages(caplog)] == [f"training: {step}/9 steps ({100 * step / 9:.0f}%)"
                                                         for step in (7, 8, 9)]  # counted from the checkpoint's step
    assert lines.training.done_before == 6
    caplog.clear()
    scorer = Regression()
    scorer.pass_name = "gradient scoring"  # a module names its pass
    with caplog.at_level(logging.INFO, logger=LOGGER):
        trainer.validate(scorer, dataloaders=loader(8), verbose=False)
    assert [m.split(",")[0] for m in messages(caplog)] == [f"gradient scoring: {b}/4 batches ({25 * b}%)"
                                                         for b in (1, 2, 3, 4)]


def test_the_progress_bar_names_the_modules_pass(tmp_path, capsys):
    """Lightning's bar says "Validation" for every validate; the gradient pass of mode=importance is named."""
    scorer = Regression()
    scorer.pass_name = "gradient scoring"
    trainer = pl.Trainer(callbacks=[NamedPassBar()], logger=False, enable_checkpointing=False,
                         enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer.validate(scorer, dataloaders=loader(8), verbose=False)
    shown = capsys.readouterr().out
    assert "Gradient scoring" in shown and "Validation" not in shown
    trainer.validate(Regression(), dataloaders=loader(8), verbose=False)  # a module without a name: Lightning's
    assert "Validation" in capsys.readouterr().out
