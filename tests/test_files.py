"""Files headlab writes atomically: the mode any new file gets (mkstemp's 0600 kept a group from a shared folder), and
JSON input that repeats a key."""

from __future__ import annotations

import os

import pytest

from headlab.errors import UserError
from headlab.files import read_json, write_json_atomic, write_json_if_changed
from headlab.reporting.records import write_records


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_atomic_files_get_the_mode_the_umask_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        paths = [write_json_atomic(tmp_path / "results.json", {"a": 1}),
                 write_records(tmp_path / "records.parquet", [{"example": 0, "label": 1}])]
        (tmp_path / "plain.txt").write_text("a file made the ordinary way")
    finally:
        os.umask(previous)
    expected = (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert expected == 0o666 & ~umask
    assert [path.stat().st_mode & 0o777 for path in paths] == [expected, expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "records.parquet", "results.json"]


def test_a_json_key_given_twice_is_an_error(tmp_path):
    path = tmp_path / "importance.json"
    path.write_text('{"model": "a", "nested": {"x": 1, "x": 2}}')
    with pytest.raises(UserError, match=r"importance file .* has the key 'x' twice in one object"):
        read_json(path, "importance")


def test_two_writers_of_one_file_never_share_a_temporary_name(tmp_path):
    """Two studies in one folder collided on '.bars_validation_f1.png.tmp.png' (a fixed temporary name: one writer's
    rename took the other's file away). Each write now has a temporary file of its own."""
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    from headlab.files import write_frame_atomic, write_text_atomic
    from headlab.reporting.plots import _save

    frame = pd.DataFrame({"a": range(2000)})

    def write(number):
        import matplotlib.pyplot as plt

        for _ in range(10):
            write_frame_atomic(frame, tmp_path / "table.csv")
            write_text_atomic(tmp_path / "table.md", f"writer {number}\n" * 2000)
        figure = plt.figure()
        _save(figure, tmp_path / "bars", ["png"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(8)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bars.png", "table.csv", "table.md"]
    assert pd.read_csv(tmp_path / "table.csv").equals(frame)


def test_a_json_file_of_the_same_content_is_not_written_again(tmp_path):
    """Its modification time (what the jobs that read it compare) stays when the content is the same, and changes
    with the content."""
    import os

    path = write_json_if_changed(tmp_path / "clusters.json", {"labels": {"L0H0": "dense"}})
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    write_json_if_changed(path, {"labels": {"L0H0": "dense"}})
    assert path.stat().st_mtime_ns == 1_000_000_000
    write_json_if_changed(path, {"labels": {"L0H0": "vertical"}})
    assert path.stat().st_mtime_ns != 1_000_000_000 and read_json(path, "clusters")["labels"]["L0H0"] == "vertical"
