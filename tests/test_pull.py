"""Checkpoints between hosts: `python -m rlctl.launch.remote pull` streams a folder, `unpack_pulled` takes only a whole
copy, and `push` writes one sent; each side keeps a copy that is as new as the one that came."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from rlctl.launch.hosts import unpack_pulled
from rlctl.launch.remote import PULL_MANIFEST, FileStreamError, folder_files, write_file_stream


def pulled(folder, *args: str) -> bytes:
    """What the remote side writes for `folder`, from a real `python -m rlctl.launch.remote pull`."""
    proc = subprocess.run([sys.executable, "-m", "rlctl.launch.remote", "pull", str(folder), *args],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    """A tar stream of (name, content) members, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def manifest(**sizes: int) -> tuple[str, bytes]:
    return PULL_MANIFEST, json.dumps({"files": sizes}).encode()


@pytest.fixture
def remote(tmp_path):
    """A remote checkpoint folder: two checkpoints (one large), a writer's leftover temporary and a subfolder."""
    d = tmp_path / "remote"
    d.mkdir()
    (d / "latest.pt").write_bytes(b"L" * 300_000)
    (d / "best.pt").write_bytes(b"best")
    (d / ".latest.pt.123.tmp").write_bytes(b"half")
    (d / "sub").mkdir()
    (d / "sub" / "x.pt").write_bytes(b"x")
    return d


def test_a_whole_transfer_lands_every_plain_file(remote, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert unpack_pulled(pulled(remote), home) == ["best.pt", "latest.pt"]
    assert (home / "latest.pt").read_bytes() == b"L" * 300_000 and (home / "best.pt").read_bytes() == b"best"
    assert sorted(p.name for p in home.iterdir()) == ["best.pt", "latest.pt"]


def test_a_missing_folder_pulls_as_empty(tmp_path):
    assert unpack_pulled(pulled(tmp_path / "never-made"), tmp_path) == []


@pytest.mark.parametrize("cut", [512, 1024 + 512, 100_000, -10240])
def test_a_transfer_that_lost_its_tail_writes_nothing(remote, tmp_path, cut):
    # A tar reader stops quietly at a broken header: only the manifest tells that latest.pt never came.
    home = tmp_path / "home"
    home.mkdir()
    data = pulled(remote)
    with pytest.raises(FileStreamError, match="incomplete transfer|unreadable transfer|without its manifest"):
        unpack_pulled(data[:cut], home)
    assert list(home.iterdir()) == []


def test_a_stream_without_a_manifest_or_with_a_false_one_is_refused(tmp_path):
    with pytest.raises(FileStreamError, match="without its manifest"):
        unpack_pulled(tar_of([("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(FileStreamError, match="without its manifest"):
        unpack_pulled(tar_of([(PULL_MANIFEST, b"[1, 2]"), ("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(FileStreamError, match=r"incomplete transfer \(latest.pt\)"):
        unpack_pulled(tar_of([manifest(**{"latest.pt": 4}), ("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(FileStreamError, match="unreadable transfer"):
        unpack_pulled(b"not a tar at all" * 100, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_names_that_would_land_outside_the_folder_are_never_written(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    evil = [manifest(**{"best.pt": 2}), ("../escape.pt", b"no"), ("/tmp/abs.pt", b"no"), ("sub/x.pt", b"no"),
            (".hidden", b"no"), ("best.pt", b"ok")]
    assert unpack_pulled(tar_of(evil), home) == ["best.pt"]
    assert sorted(p.name for p in home.iterdir()) == ["best.pt"] and not (tmp_path / "escape.pt").exists()


def aged(path, seconds_ago: float) -> float:
    """Set `path`'s modification time `seconds_ago` before now; returns it."""
    at = 1_700_000_000.0 - seconds_ago
    os.utime(path, (at, at))
    return at


def test_since_and_suffix_send_only_files_modified_after_it_and_so_named(remote, tmp_path):
    aged(remote / "best.pt", 100)
    cut = aged(remote / "latest.pt", 10) - 1
    home = tmp_path / "home"
    assert unpack_pulled(pulled(remote, "--since", repr(cut)), home) == ["latest.pt"]
    assert unpack_pulled(pulled(remote, "--since", repr(cut + 1)), home) == []
    (remote / "replay-0.npz").write_bytes(b"big")
    assert unpack_pulled(pulled(remote, "--suffix", ".pt"), home) == ["best.pt", "latest.pt"]


def test_a_copy_as_new_as_the_one_that_comes_is_kept_and_an_older_one_replaced(remote, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "latest.pt").write_bytes(b"newer here")
    aged(home / "latest.pt", 5)
    (home / "best.pt").write_bytes(b"older here")
    aged(home / "best.pt", 500)
    sent = aged(remote / "latest.pt", 50), aged(remote / "best.pt", 50)
    assert unpack_pulled(pulled(remote), home) == ["best.pt", "latest.pt"]  # both came; one was newer
    assert (home / "latest.pt").read_bytes() == b"newer here"
    assert (home / "best.pt").read_bytes() == b"best" and (home / "best.pt").stat().st_mtime == sent[1]
    # A stream whose manifest has no usable times (an older rlctl's) replaces whatever is there.
    lying = json.dumps({"files": {"latest.pt": 3}, "mtimes": {"latest.pt": "soon"}}).encode()
    assert unpack_pulled(tar_of([(PULL_MANIFEST, lying), ("latest.pt", b"old")]), home) == ["latest.pt"]
    assert (home / "latest.pt").read_bytes() == b"old"


def push(folder, stream: bytes) -> subprocess.CompletedProcess:
    """A real `python -m rlctl.launch.remote push folder` fed `stream`."""
    return subprocess.run([sys.executable, "-m", "rlctl.launch.remote", "push", str(folder)], input=stream,
                          capture_output=True, timeout=60)


def test_push_writes_a_stream_into_a_new_folder_and_keeps_what_is_as_new_there(remote, tmp_path):
    aged(remote / "latest.pt", 50)
    aged(remote / "best.pt", 50)
    out = io.BytesIO()
    write_file_stream(out, folder_files(remote))
    target = tmp_path / "far" / "checkpoints"
    proc = push(target, out.getvalue())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"written": ["best.pt", "latest.pt"]}
    assert (target / "latest.pt").read_bytes() == b"L" * 300_000 and target.stat().st_mode & 0o777 == 0o700
    assert (target / "latest.pt").stat().st_mode & 0o777 == 0o600
    aged(target / "best.pt", 1)  # written there since: newer than what comes again
    assert json.loads(push(target, out.getvalue()).stdout) == {"written": []}
    assert (target / "best.pt").read_bytes() == b"best"


def test_push_of_a_broken_stream_writes_nothing_and_fails(remote, tmp_path):
    out = io.BytesIO()
    write_file_stream(out, folder_files(remote))
    target = tmp_path / "far"
    proc = push(target, out.getvalue()[:100_000])
    assert proc.returncode == 1 and re.search(rb"(incomplete|unreadable) transfer", proc.stderr), proc.stderr
    assert not target.exists() or list(target.iterdir()) == []
