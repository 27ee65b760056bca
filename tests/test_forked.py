"""``tests/forked.py`` answers as ``subprocess.run`` does for the same script: output, exit status, traceback of an
uncaught exception, working folder, environment, ``sys.argv`` and ``atexit`` handlers."""

from __future__ import annotations

import os
import sys

import pytest
from forked import run_script

SCRIPT = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran"))
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("HEADLAB_PROBE"))
print("path0", os.path.basename(sys.path[0]))
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "exit":
    sys.exit(3)
if what == "message":
    sys.exit("stopped: a message")
if what == "raise":
    raise RuntimeError("a bug")
"""


@pytest.mark.parametrize("what", ["ok", "exit", "message", "raise"])
def test_a_forked_run_answers_as_a_subprocess(tmp_path, what):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    (tmp_path / "work").mkdir()
    env = {**os.environ, "HEADLAB_PROBE": "seen"}
    command = [sys.executable, str(script), what, "a=b,c"]
    forked, fresh = (run_script(command, cwd=tmp_path / "work", env=env, fresh=fresh) for fresh in (False, True))
    assert forked.returncode == fresh.returncode == {"ok": 0, "exit": 3, "message": 1, "raise": 1}[what]
    assert forked.stdout == fresh.stdout
    assert "argv ['" + what + "', 'a=b,c'] cwd work env seen" in forked.stdout and "atexit ran" in forked.stdout
    assert f"path0 {tmp_path.name}" in forked.stdout
    if what == "raise":  # file paths and line numbers of the runner's frames differ; the error is the same
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "RuntimeError: a bug"
        assert "Traceback" in forked.stderr
    else:
        assert forked.stderr == fresh.stderr
