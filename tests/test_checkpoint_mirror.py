"""Checkpoints of SSH hosts between them and the run directory (rlctl.supervise.checkpoint_mirror): which files a host
is sent, which hosts write them, a head host that cannot take them failing the start, and the status line. The
mirror over real SSH hosts, with a head host lost and the run resumed on another: tests/test_ssh.py."""

from __future__ import annotations

import re

import pytest

from rlctl.launch.plan import make_plan
from rlctl.supervise.checkpoint_mirror import CheckpointMirror, CheckpointsNotSent, checkpoints_to_send, writer_hosts
from rlctl.views.console import checkpoints_home_text, head_moves_text, header_lines
from test_host_loss import HOSTS, spec_of

# Host names that resolve nowhere: ssh fails at once, as it does for a host that is gone.
GONE = HOSTS.replace('name = "h1"', 'name = "h1"\naddress = "rlctl-test-gone-h1.invalid"').replace(
    'name = "h3"', 'name = "h3"\naddress = "rlctl-test-gone-h3.invalid"')


def test_a_host_is_sent_every_checkpoint_but_the_older_numbered_ones_and_no_replay_snapshot(tmp_path):
    for name in ("latest.pt", "best.pt", "ckpt-000002.pt", "ckpt-000010.pt", ".latest.pt.12.tmp", "replay-0.npz"):
        (tmp_path / name).write_bytes(b"x")
    assert checkpoints_to_send(tmp_path) == ["best.pt", "latest.pt", "ckpt-000010.pt"]
    assert checkpoints_to_send(tmp_path / "none") == []


def test_the_writers_are_the_learner_head_and_the_evaluator(tmp_path):
    spec = spec_of(tmp_path)
    assert writer_hosts(make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes) == {"h1", "h3"}


def test_a_start_with_nothing_at_home_sends_nothing(tmp_path):
    spec = spec_of(tmp_path, GONE)
    mirror, said = CheckpointMirror(spec, "v-1", tmp_path / "home"), []
    mirror.seed(make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes, said.append)
    assert said == [] and mirror.document() == {}


def test_a_head_host_that_cannot_take_the_checkpoints_fails_the_start(tmp_path):
    spec = spec_of(tmp_path, GONE)
    home = tmp_path / "home"
    home.mkdir()
    (home / "latest.pt").write_bytes(b"state")
    mirror, said = CheckpointMirror(spec, "v-1", home), []
    with pytest.raises(CheckpointsNotSent, match="to h1, the learner head's host: .*would start from nothing"):
        mirror.seed(make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes, said.append)


def test_an_evaluator_host_that_cannot_take_them_is_said_and_the_run_starts(tmp_path):
    spec = spec_of(tmp_path, GONE.replace('name = "h1"\naddress = "rlctl-test-gone-h1.invalid"',
                                          'name = "h1"\naddress = "127.0.0.1"\nadvertise_address = "10.0.0.1"'))
    home = tmp_path / "home"
    home.mkdir()
    (home / "latest.pt").write_bytes(b"state")
    mirror, said = CheckpointMirror(spec, "v-1", home), []
    assert "h1" not in mirror.hosts  # this machine's: its learner writes into the run directory itself
    mirror.seed(make_plan(spec, "v-1", str(tmp_path / "run"), 42000).processes, said.append)
    assert len(said) == 1 and said[0].startswith("could not send the run's checkpoints to h3: "), said


def test_the_status_says_when_checkpoints_last_came_home_and_which_hosts_failed():
    state = {"run_id": "r", "status": "running", "checkpoints_home": {
        "at": 1_700_000_000.0, "host": "h1", "files": ["latest.pt"],
        "errors": {"h3": "ssh: Could not resolve hostname h3\nmore"}}}
    text = checkpoints_home_text(state)
    assert re.fullmatch(r"checkpoints home \d\d:\d\d:\d\d from h1 \(latest\.pt\) \| checkpoints not from h3: "
                        r"ssh: Could not resolve hostname h3", text), text
    assert text in header_lines(state)
    assert checkpoints_home_text({"checkpoints_home": "junk"}) is None and checkpoints_home_text({}) is None


def test_the_status_says_where_the_learner_head_went():
    state = {"run_id": "r", "status": "running", "head_moves": [
        {"lost": "h1", "at": 1_700_000_000.0, "head": "h2"}, {"lost": "h2", "at": 1_700_000_600.0, "head": "h1"}, 7]}
    text = head_moves_text(state)
    assert re.fullmatch(r"learner head h1 -> h2 \(h1 lost \d\d:\d\d:\d\d\) -> h1 \(h2 lost \d\d:\d\d:\d\d\)", text), text
    assert text in header_lines(state) and head_moves_text({"head_moves": []}) is None
