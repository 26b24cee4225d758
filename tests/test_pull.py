"""Checkpoints coming home: `python -m rlctl.launch.remote pull` streams a folder, `unpack_pulled` takes only a whole copy."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import pytest

from rlctl.launch.hosts import PullError, unpack_pulled
from rlctl.launch.remote import PULL_MANIFEST


def pulled(folder) -> bytes:
    """What the remote side writes for `folder`, from a real `python -m rlctl.launch.remote pull`."""
    proc = subprocess.run([sys.executable, "-m", "rlctl.launch.remote", "pull", str(folder)], capture_output=True, timeout=60)
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
    with pytest.raises(PullError, match="incomplete transfer|unreadable transfer|without its manifest"):
        unpack_pulled(data[:cut], home)
    assert list(home.iterdir()) == []


def test_a_stream_without_a_manifest_or_with_a_false_one_is_refused(tmp_path):
    with pytest.raises(PullError, match="without its manifest"):
        unpack_pulled(tar_of([("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(PullError, match="without its manifest"):
        unpack_pulled(tar_of([(PULL_MANIFEST, b"[1, 2]"), ("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(PullError, match=r"incomplete transfer \(latest.pt\)"):
        unpack_pulled(tar_of([manifest(**{"latest.pt": 4}), ("latest.pt", b"abc")]), tmp_path)
    with pytest.raises(PullError, match="unreadable transfer"):
        unpack_pulled(b"not a tar at all" * 100, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_names_that_would_land_outside_the_folder_are_never_written(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    evil = [manifest(**{"best.pt": 2}), ("../escape.pt", b"no"), ("/tmp/abs.pt", b"no"), ("sub/x.pt", b"no"),
            (".hidden", b"no"), ("best.pt", b"ok")]
    assert unpack_pulled(tar_of(evil), home) == ["best.pt"]
    assert sorted(p.name for p in home.iterdir()) == ["best.pt"] and not (tmp_path / "escape.pt").exists()
