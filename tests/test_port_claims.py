"""Port ranges claimed machine-wide (rlctl.launch.port_claims): runs started at the same moment get different
ranges; a lapsed or garbled claim, or a claims folder that is not this user's, is ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO, run_cli, small_job
from rlctl.job.load import load_job
from rlctl.launch import port_claims
from rlctl.launch.plan import choose_base_port, ports_needed


@pytest.fixture(autouse=True)
def own_temp(tmp_path, monkeypatch):
    """Claims in this test's own temp folder (tempfile caches its folder: set it directly)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _claims() -> dict:
    return json.loads((port_claims.claims_dir() / "port-claims.json").read_text())


def test_a_claimed_range_is_not_chosen_again_until_its_claim_lapses(tmp_path):
    spec = load_job(small_job(tmp_path))
    need = ports_needed(spec)
    first = choose_base_port(spec, claim=True)
    second = choose_base_port(spec, claim=True)
    assert second != first and abs(second - first) >= need  # both ranges are free: the claim tells them apart
    assert {int(p) for p in _claims()} == set(range(first, first + need)) | set(range(second, second + need))
    assert choose_base_port(spec) not in (first, second)  # choosing without claiming still skips claimed ranges
    # Lapsed claims count for nothing.
    path = port_claims.claims_dir() / "port-claims.json"
    path.write_text(json.dumps({p: time.time() - 1 for p in _claims()}))
    assert choose_base_port(spec) == first


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"x": 1e99}', '{"30000": "soon"}', '{"99999": 1e12}',
                                  '{"30000": true}'])
def test_a_garbled_claims_file_is_ignored_and_rewritten(tmp_path, text):
    spec = load_job(small_job(tmp_path))
    choose_base_port(spec, claim=True)
    (port_claims.claims_dir() / "port-claims.json").write_text(text)
    base = choose_base_port(spec, claim=True)
    assert {int(p) for p in _claims()} == set(range(base, base + ports_needed(spec)))


def test_a_claims_folder_that_is_a_link_or_open_to_others_is_not_used(tmp_path):
    spec = load_job(small_job(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, port_claims.claims_dir())
    base = choose_base_port(spec, claim=True)
    assert base and not any(elsewhere.iterdir())
    os.unlink(port_claims.claims_dir())
    port_claims.claims_dir().mkdir(mode=0o777)
    os.chmod(port_claims.claims_dir(), 0o777)
    assert choose_base_port(spec, claim=True) == base and not any(port_claims.claims_dir().iterdir())


def test_two_runs_started_at_once_bind_different_ranges(tmp_path):
    """Two `rlctl run --detach` of the same job, started together: neither fails on a port the other took."""
    job = small_job(tmp_path, stop="env_steps = 2000\nwall_s = 60")
    runs = tmp_path / "runs"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-m", "rlctl", "run", str(job), "--detach", "--runs-dir", str(runs)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for _ in range(2)]
    ids = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(ids)) == 2, ids
    bases = {json.loads((runs / i / "plan.json").read_text())["base_port"] for i in ids}
    assert len(bases) == 2, bases
    for run_id in ids:
        run_cli(["stop", run_id, "--runs-dir", str(runs)], timeout=120)
