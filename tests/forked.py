"""The entry scripts run as ``python SCRIPT ARGS`` runs them, in a process of their own, but forked from a server
that has imported torch, transformers, Lightning, Hydra, datasets and the rest of ``PRELOAD`` already (6-7 s of
every start on 2 cores; the suite starts hundreds).

``run_script`` answers like ``subprocess.run(command, capture_output=True, text=True)``. The server
(``python tests/forked.py``, started once per environment) has only imported ``PRELOAD`` (nothing has run torch
in it); for each request it forks a child that takes the caller's working folder, environment and ``sys.argv``, runs
the script as ``__main__`` (``runpy``), then the ``atexit`` handlers, and exits with the script's status (a
traceback and status 1 for an uncaught exception, as the interpreter does). Variables read when the preloaded
modules are imported (Hugging Face's cache and offline switches, threads) cannot change in a fork: an environment
that differs from a server's in anything but ``PER_RUN`` gets a server of its own. ``fresh=True`` (or
``HEADLAB_TESTS_FORK=0`` for all) runs a plain subprocess: signals, timing and what-gets-imported tests use those.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future
from pathlib import Path

# what nearly every run imports (a job: 1.2 s of imports beyond torch, Lightning and transformers on 2 cores). Not
# wandb: its import makes the temporary folder of its media, which each child would delete at its exit
PRELOAD = ("torch", "lightning.pytorch", "transformers", "hydra", "datasets", "pandas", "pyarrow.parquet",
           "scipy.stats", "sklearn.cluster")
# Every subprocess limit of the suite: a guard against a hang, never a time limit. A run that is merely slow (a slow
# or shared machine: 2-3x the usual times) must never reach it, so a correct change is never failed by the clock.
HANG_GUARD = 3600
# read when a run starts, not when the preloaded modules are imported: may differ between runs of one server
PER_RUN = ("WANDB_", "PYTHONUNBUFFERED", "HYDRA_FULL_ERROR", "PYTEST_", "COLUMNS", "LINES")


class Server:
    """A ``python tests/forked.py`` process: requests (JSON lines) in, ``ID STATUS`` lines out as children end."""

    def __init__(self, env: dict[str, str]):
        self.process = subprocess.Popen([sys.executable, __file__], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pending: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            kind, ident, value = line.split()
            future = self.pending[int(ident)]
            if kind == "pid":
                future.pid = int(value)
            else:
                future.set_result(int(value))
        with self.lock:  # the server died: every request still waiting fails
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(RuntimeError("the fork server exited"))

    def stop(self) -> None:
        """No new requests; the server exits once its children have (their statuses still come back)."""
        with self.lock:
            self.process.stdin.close()

    def run(self, request: dict, timeout: float) -> int | None:
        """The child's exit status; None if this server was stopped before the request went out."""
        future = Future()
        with self.lock:
            if self.process.stdin.closed:
                return None
            ident, self.next_id = self.next_id, self.next_id + 1
            self.pending[ident] = future
            self.process.stdin.write(json.dumps({"id": ident, **request}) + "\n")
            self.process.stdin.flush()
        try:
            return future.result(timeout)
        except TimeoutError:
            pid = getattr(future, "pid", None)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            raise


KEPT = 2  # servers alive per test process (about 0.3 GB each): the least recently used one above it stops
_servers: dict[tuple, Server] = {}  # oldest use first
_servers_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> Server:
    key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(PER_RUN)))
    with _servers_lock:
        server = _servers.pop(key, None)
        if server is None or server.process.poll() is not None:
            server = Server(env)
        _servers[key] = server
        while len(_servers) > KEPT:
            _servers.pop(next(iter(_servers))).stop()
        return server


def run_script(command: list, *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
               timeout: float | None = HANG_GUARD, capture_output: bool = True, text: bool = True, check: bool = False,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run`` with the same arguments, for ``command = [sys.executable, SCRIPT, *ARGS]`` forked from a
    preloaded server (anything else, ``fresh``, or no captured output: ``subprocess.run`` itself)."""
    command = [str(part) for part in command]
    env = dict(os.environ if env is None else env)
    plain = (fresh or not capture_output or os.environ.get("HEADLAB_TESTS_FORK") == "0"
             or command[0] != sys.executable or len(command) < 2 or command[1].startswith("-"))
    if plain:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=capture_output, text=text, timeout=timeout,
                              check=check)
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        request = {"script": command[1], "args": command[2:], "cwd": str(cwd or os.getcwd()), "env": env,
                   "out": out, "err": err}
        try:
            status = None
            while status is None:  # a server stopped meanwhile (another environment took its place): the next
                status = _server_for(env).run(request, timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(command, timeout) from None
        output = [Path(path).read_bytes() if os.path.exists(path) else b"" for path in (out, err)]
    if text:
        output = [data.decode(errors="replace") for data in output]
    if check and status != 0:
        raise subprocess.CalledProcessError(status, command, *output)
    return subprocess.CompletedProcess(command, status, *output)


# ---- the server ------------------------------------------------------------------------------------------------


def _run_as_main(request: dict) -> None:
    """In the forked child: the interpreter's ``python script args``, output to files, then exit."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["out"]), (2, request["err"])):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    # new stream objects on the redirected descriptors (the server's may hold unflushed protocol lines)
    streams = {id(sys.stdout): None, id(sys.stderr): None}
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    streams = dict(zip(streams, (sys.stdout, sys.stderr)))
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:  # handlers made at import
        for handler in getattr(logger, "handlers", ()):  # (datasets' own) write to the new streams
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams:
                handler.setStream(streams[id(handler.stream)])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = str(Path(request["script"]).parent)
    status = 0
    try:
        runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve() -> None:
    # Lightning gives its loggers a handler of their own (and stops them propagating) when it is imported before
    # logging is set up; the entry scripts import it after Hydra has set up logging, so that its lines reach the
    # job's log file: import it that way here too
    root, placeholder = logging.getLogger(), logging.NullHandler()
    root.addHandler(placeholder)
    for name in PRELOAD:
        __import__(name)
    root.removeHandler(placeholder)
    out = sys.stdout
    write_lock = threading.Lock()

    def report(kind: str, ident: int, value: int) -> None:
        with write_lock:
            out.write(f"{kind} {ident} {value}\n")
            out.flush()

    def wait(ident: int, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        report("status", ident, os.waitstatus_to_exitcode(status))

    waiters = []
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _run_as_main(request)
            finally:
                os._exit(1)
        report("pid", request["id"], pid)
        waiters.append(threading.Thread(target=wait, args=(request["id"], pid)))
        waiters[-1].start()
    for waiter in waiters:  # stopped: the runs under way finish and report first
        waiter.join()


if __name__ == "__main__":
    serve()
