"""Durable atomic writes (``streamrec.atomic``) and the three places that use them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamrec import atomic
from streamrec.atomic import atomic_write, commit_dir, fsync_tree


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "CURRENT"
    atomic_write(target, "v1\n")
    atomic_write(target, b"v2\n")
    assert target.read_text() == "v2\n"
    assert os.listdir(tmp_path) == ["CURRENT"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    atomic_write(target, "old")

    def crash(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["state.json"]  # the temp file is removed


def test_atomic_write_fsyncs_the_file_and_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", spy)
    atomic_write(tmp_path / "f", "x")
    assert len(synced) == 2 and synced[1] == str(tmp_path)  # the temp file, then the folder


def test_commit_dir_moves_a_synced_tree_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / ".tmp-1"
    (tmp / "sub").mkdir(parents=True)
    (tmp / "a.bin").write_bytes(b"a")
    (tmp / "sub" / "b.bin").write_bytes(b"b")
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    commit_dir(tmp, tmp_path / "ckpt-1")
    assert (tmp_path / "ckpt-1" / "sub" / "b.bin").read_bytes() == b"b"
    assert not tmp.exists()
    assert len(calls) == 2 + 2 + 1  # two files, two folders of the tree, the parent
    fsync_tree(tmp_path)  # a tree with nothing to do is fine too


def test_replay_state_is_written_atomically(tmp_path: Path) -> None:
    from stream.replay.runner import ReplayState

    path = tmp_path / "replay" / "plan.json"
    ReplayState(path, "plan", 10, {0: 5}).save()
    ReplayState(path, "plan", 20, {0: 9, 1: 3}).save()
    again = ReplayState.load(path, "plan")
    assert again is not None and again.acked == 20 and again.offsets == {0: 9, 1: 3}
    assert os.listdir(path.parent) == ["plan.json"]
