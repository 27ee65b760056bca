"""What a user sees of the command line: folder and file names under the filesystem's 255 bytes (a long override
list, a fine-tune's recipe or a path in ``importance.sweep``, failed with ``File name too long``), and ``--help``."""

from __future__ import annotations

import json
import re
import shlex

from conftest import run
from forked import HANG_GUARD, run_script

from headlab.cli.hydra_glue import checkpoint_tag, job_dir_name
from headlab.files import short_name


def test_long_names_become_a_readable_start_and_a_hash():
    overrides = ",".join(f"data.option_{i}=value_{i}" for i in range(40))  # ~900 bytes
    name = job_dir_name(overrides)
    assert len(name.encode()) <= 120 and name.startswith("data.option_0-value_0+data.option_1-value_1+")
    assert re.fullmatch(r"(data\.option_\d+-value_\d+\+)+[0-9a-f]{10}", name)  # cut between overrides, then the hash
    assert job_dir_name(overrides + "1") != name  # the hash covers all of it
    assert job_dir_name("mask.heads=L0,mask=prune") == "mask.heads-L0+mask-prune"  # short names stay readable
    assert job_dir_name("") == "defaults" and job_dir_name("ckpt=/a/b") == "ckpt-_a_b"
    swept = job_dir_name(f"experiment=guan2020_table2,mask.clusters=/runs/{'x' * 150}/clusters.json,plan=prune_dense")
    assert swept.startswith("experiment-guan2020_table2+plan-prune_dense+") and len(swept.encode()) <= 120
    listed = job_dir_name("mask.heads=[L0,L1],mask=prune")  # a list is one part; brackets out, a hash in
    assert re.fullmatch(r"mask\.heads-L0\+L1\+mask-prune-[0-9a-f]{8}", listed)
    assert listed != job_dir_name("mask.heads=[L0],L1,mask=prune") and listed == job_dir_name(
        "mask.heads=[L0,L1],mask=prune")  # deterministic, and no two command lines share a folder
    assert len(short_name("é" * 300).encode()) <= 120  # cut on a character, not inside one
    tag = checkpoint_tag("/runs/" + "x" * 300)
    assert len(tag.encode()) <= 60 + 9 and tag != checkpoint_tag("/runs/" + "x" * 299)


def pastes(path: str) -> bool:
    """``path`` pasted unquoted into a shell word and an override reads back as itself (Hydra's override parser)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    words = shlex.split(f"mask.clusters={path}/clusters.json")
    try:
        override, = OverridesParser.create().parse_overrides(words)
    except (OverrideParseException, ValueError):
        return False
    return override.value() == f"{path}/clusters.json"


# override_dirname as Hydra hands it to the folder names: what users type, lists, paths, quotes, prefixes
TYPED = ["study=quick", "study.finetune.trainer.max_epochs=1,study=quick", "mask.heads=L0,mask=prune",
         "mask.heads=[L0,L1],mask=prune", "ckpt_path=/runs/seed=1,optim.lr=1e-4/model",
         "demo.texts=['A pair.','Another one, with a comma.']", "++study.finetune.optim.lr=1e-4,~study.seeds",
         "compare.names={a: 1},x=${y}", "experiment=guan2020_table2,mask.clusters=/runs/a b/c.json,plan=prune_dense",
         "data.option=" + "v" * 300]


def test_every_folder_headlab_prints_pastes_into_an_override_as_printed():
    """Job, study, train, checkpoint-tag and report folders hold none of Hydra's syntax (``=``, ``,``, brackets,
    quotes, ``~``, spaces): ``mask.clusters=.../finetuned-study=quick-a123da94/...`` failed with ``mismatched input
    '='``. The same command line finds the same folder."""
    from headlab.cli.hydra_glue import ablate_run_dir
    from headlab.reporting.report import report_folder
    from headlab.reporting.statistics import Resampling

    folders = []
    for overrides in TYPED:
        for mode, sweep_dir, study_checkpoint, ckpt in (("eval", None, None, "/runs/lr=1e-4,seed=0"),
                                                          ("cluster", None, None, None),
                                                          ("report", "/runs/x=1,y=[2]", None, None),
                                                          ("study", None, None, None),
                                                          ("study", None, "/runs/seed=1,a=b", None)):
            folders.append(ablate_run_dir(mode, "demo_qa", "minilm", ckpt, None, study_checkpoint, sweep_dir,
                                          overrides))
        folders.append(f"outputs/train/demo_qa/minilm/{job_dir_name(overrides)}")  # train.py's run and sweep dirs
        assert folders[-2] == ablate_run_dir("study", "demo_qa", "minilm", None, None, "/runs/seed=1,a=b", None,
                                             overrides)  # deterministic
    folders.append(str(report_folder("/runs/x", Resampling(resamples=400, permutations=400, confidence=0.9), "bh",
                                     ("png", "pdf"))))
    bad = [folder for folder in folders if not pastes(folder)]
    assert not bad, bad
    assert pastes("/runs/plain") and not pastes("/runs/finetuned-study=quick-a123da94")  # the check itself


def test_a_job_with_a_very_long_command_line_runs(tmp_path):
    texts = [f"Sentence number {i} is here. And another one follows it." for i in range(12)]  # ~700 bytes
    result = run("ablate.py", "mode=demo", "demo.texts=[" + ",".join(f"'{t}'" for t in texts) + "]",
                 "demo.text_pairs=[" + ",".join("'A pair.'" for _ in texts) + "]", cwd_tmp=tmp_path, cwd=tmp_path)
    written = next((tmp_path / "outputs").rglob("demo.json"))
    assert all(len(part.encode()) <= 255 for part in written.parts)
    assert len(json.loads(written.read_text())) > 0 and "records written to" in result.stdout
    printed = re.search(r"records written to (\S+)", result.stdout)[1]
    assert printed == str(written) and pastes(str(written.parent))  # quotes, commas and brackets left out


def test_help_starts_with_every_mode_one_line_each():
    import sys

    from conftest import ROOT

    from headlab.cli.ablate import MODES

    out = run_script([sys.executable, str(ROOT / "ablate.py"), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=HANG_GUARD).stdout
    head = out.split("== Configuration groups ==")[0]
    listed = [line.split()[0] for line in head.split("== Modes (mode=...) ==")[1].strip().splitlines()[:len(MODES)]]
    assert sorted(listed) == sorted(MODES) and out.index("== Modes") < out.index("== Config ==")
    groups = out.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert "schema/" not in groups and "\ntask: cola, demo_pairs, demo_qa" in groups and "\nstudy: " in groups
    trained = run_script([sys.executable, str(ROOT / "train.py"), "--help"], cwd=ROOT, capture_output=True,
                             text=True, timeout=HANG_GUARD).stdout
    groups = trained.split("== Configuration groups ==")[1].split("== Config ==")[0]
    assert trained.startswith("train.py: fine-tune") and "\nmodel: " in groups
    assert not any(f"\n{group}" in groups for group in ("schema/", "study:", "experiment:"))


def test_each_report_and_study_gets_its_own_folder():
    from headlab.cli.hydra_glue import ablate_run_dir

    def folder(mode, sweep_dir=None, study_checkpoint=None):
        return ablate_run_dir(mode, "demo_qa", "minilm", None, None, study_checkpoint, sweep_dir, "")

    assert folder("report", "/runs/table2") != folder("report", "/runs/table3")
    assert folder("report", "/runs/table2").startswith("outputs/ablate/report/from_jobs/table2-")
    assert folder("study") == "outputs/study/demo_qa/minilm/finetuned"
    assert folder("study", study_checkpoint="/runs/a/job").startswith("outputs/study/demo_qa/minilm/job-")
    assert folder("study", study_checkpoint="/runs/a/job") != folder("study", study_checkpoint="/runs/b/job")

    def study(overrides):
        return ablate_run_dir("study", "demo_qa", "minilm", None, None, None, None, overrides).split("/")[-1]

    assert re.fullmatch(r"finetuned-finetune\.trainer\.max_epochs-1-[0-9a-f]{8}",
                        study("study.finetune.trainer.max_epochs=1"))
    assert study("study.finetune.trainer.max_epochs=1") != study("study.finetune.trainer.max_epochs=2")
    assert re.fullmatch(r"finetuned-finetune\.optim\.lr-1e-4\+study-quick-[0-9a-f]{8}",
                        study("++study.finetune.optim.lr=1e-4,study=quick"))  # as the command line reaches Hydra
    long = study("study.finetune.optim.lr=5e-5,study.syntax.syntax.conllu=/data/" + "x" * 300 + ".conllu")
    assert re.fullmatch(r"finetuned-finetune\.optim\.lr-5e-5-[0-9a-f]{8}", long)  # cut after a whole override
    assert study("study=paper").startswith("finetuned-study-paper-")


def test_a_failed_command_leaves_no_folder_and_a_finished_one_no_lock_file(tmp_path):
    """Bad input removes the job folder Hydra made for it (and the empty folders above it); one with files of an
    earlier run stays. A finished fine-tune leaves no .train.lock, a computed baseline no .lock."""
    import sys

    from conftest import ROOT

    def ablate(*overrides):
        return run_script([sys.executable, str(ROOT / "ablate.py"), "mode=eval", "model=tiny_random", "logger=none",
                               "mask=prune", "mask.heads=L9", *overrides], cwd=tmp_path, capture_output=True, text=True,
                              timeout=HANG_GUARD)

    assert ablate().returncode == 2 and list(tmp_path.iterdir()) == []
    kept = tmp_path / "earlier"
    kept.mkdir()
    (kept / "results.json").write_text("{}")
    assert ablate(f"hydra.run.dir={kept}").returncode == 2 and (kept / "results.json").is_file()


def test_the_lock_files_go_when_their_job_ends(trained):
    root, _ = trained
    assert not list(root.rglob("*.lock"))
