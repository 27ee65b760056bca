"""Sweeps through Hydra's submitit launcher: each job pickled and run in a process of its own, as on a cluster."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import run

pytestmark = pytest.mark.slow


def job_folders(sweep):
    return sorted((sweep / "eval").iterdir())


def test_a_submitit_sweep_equals_the_basic_launchers_and_resumes_where_it_stopped(trained, tmp_path):
    """``hydra/launcher=submitit_local`` (submitit's local executor: the code path of a SLURM job without the
    scheduler) gives the basic launcher's job folders, per-example records and report table; a sweep stopped part-way
    (one job's results gone, one half-written) run again recomputes those two jobs alone, to the same numbers."""
    root, _ = trained
    sweep = ["-m", "mode=eval", "mask=uniform", "mask.heads=L0H0,L1,L2H3", f"ckpt_path={root / 'train'}"]
    basic, submitit = tmp_path / "basic", tmp_path / "submitit"
    run("ablate.py", *sweep, f"hydra.sweep.dir={basic}", cwd_tmp=root)
    on_submitit = [*sweep, "hydra/launcher=submitit_local", f"hydra.sweep.dir={submitit}"]
    run("ablate.py", *on_submitit, cwd_tmp=root)
    jobs = job_folders(submitit)
    assert [j.name for j in jobs] == [j.name for j in job_folders(basic)] and len(jobs) == 3
    assert len(list((submitit / ".submitit").glob("*/*_result.pkl"))) == 3  # each job ran as a submitit job
    for ours, theirs in zip(jobs, job_folders(basic)):
        pd.testing.assert_frame_equal(pd.read_parquet(ours / "records.parquet"),
                                      pd.read_parquet(theirs / "records.parquet"))
    table = pd.read_csv(submitit / "report/table.csv")
    pd.testing.assert_frame_equal(table, pd.read_csv(basic / "report/table.csv"))
    assert sorted(set(table["job"])) == [f"eval/{j.name}" for j in jobs]
    assert (table["delta"] != 0).any(), table  # the plans move the numbers

    before = {j.name: json.loads((j / "results.json").read_text()) for j in jobs}
    done = (jobs[0] / "results.json").stat().st_mtime_ns
    (jobs[1] / "results.json").unlink()  # as if the sweep had been stopped during this job
    (jobs[2] / "results.json").write_text("{")  # ... or while it wrote its results
    run("ablate.py", *on_submitit, cwd_tmp=root)
    assert (jobs[0] / "results.json").stat().st_mtime_ns == done  # a finished job is not run again
    for job in jobs:
        assert json.loads((job / "results.json").read_text())["metrics"] == before[job.name]["metrics"]
    pd.testing.assert_frame_equal(pd.read_csv(submitit / "report/table.csv"), table)
