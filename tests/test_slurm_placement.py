"""Slurm without a cluster: what Slurm's commands print, parsed as hostile input, and roles placed on nodes."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_cli
from rlctl.launch.plan import make_plan
from rlctl.launch.slurm import (Allocation, SlurmError, allocation_from_env, parse_hostnames, parse_job_id,
                         parse_node_addresses, sbatch_script, with_allocation)
from rlctl.job.load import load_job, validate_job
from rlctl.job.resolved import resolved_dict

ALLOC = Allocation(4242, ("n1", "n2", "n3", "n4"), {f"n{i}": f"10.0.0.{i}" for i in range(1, 5)})


def slurm_spec(**cluster):
    data = resolved_dict(load_job(REPO / "jobs" / "apex-slurm.toml"))
    data["cluster"].update(cluster)
    return validate_job(data)


def test_slurm_answers_are_parsed_or_refused():
    assert parse_job_id("1234\n") == 1234 and parse_job_id("77;cluster") == 77
    for bad in ("", "-1", "12a", "0", "1" * 30, "1;2\n3"):
        with pytest.raises(SlurmError):
            parse_job_id(bad)
    assert parse_hostnames("n1\nn2\n") == ("n1", "n2")
    for bad in ("", "n1\n-oProxyCommand=x\n", "n1;rm\n", "a b\n"):
        with pytest.raises(SlurmError):
            parse_hostnames(bad)
    text = ("NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.1 NodeHostName=n1\n"
            "NodeName=n2 NodeAddr=$(reboot) State=IDLE\nNodeName=-x NodeAddr=1.2.3.4\ngarbage\n")
    assert parse_node_addresses(text) == {"n1": "10.0.0.1"}


def test_outside_an_allocation_the_error_says_how_to_get_one():
    with pytest.raises(SlurmError, match="salloc.*--sbatch"):
        allocation_from_env({})
    out = run_cli(["plan", str(REPO / "jobs" / "apex-slurm.toml")], expected_exit=2,
                  env={"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""})
    assert "not inside a Slurm allocation" in out.stderr and "Traceback" not in out.stderr


def test_roles_are_placed_by_the_cluster_rules_and_node_overrides():
    spec = with_allocation(slurm_spec(), ALLOC, "/venv/bin/python", "/home/me/work")
    hosts = {h.name: h for h in spec.hosts}
    assert [h.name for h in spec.hosts if h.learner] == ["n1"]
    assert {n: h.collectors for n, h in hosts.items()} == {"n1": 0, "n2": 2, "n3": 2, "n4": 2}
    assert hosts["n1"].replay_shards == 1 and hosts["n1"].evaluator and not any(h.evaluator for h in spec.hosts[1:])
    assert all(h.slurm_job == 4242 and h.python == "/venv/bin/python" and h.workdir == "/home/me/work"
               and h.advertise_address == ALLOC.addresses[h.name] and not h.is_local for h in spec.hosts)
    spec = with_allocation(slurm_spec(learner_nodes=2, node_count=3, evaluator="last", learner_node_collectors=1,
                                      nodes={"n3": {"collectors": 5}}), ALLOC, "python3", "/w")
    assert [(h.name, h.learner, h.collectors, h.replay_shards, h.evaluator) for h in spec.hosts] == [
        ("n1", True, 1, 1, False), ("n2", True, 1, 1, False), ("n3", False, 5, 0, True)]
    with pytest.raises(SlurmError, match="cluster.nodes.n9: no such node"):
        with_allocation(slurm_spec(nodes={"n9": {"collectors": 1}}), ALLOC, "python3", "/w")
    with pytest.raises(SlurmError, match="node_count = 9"):
        with_allocation(slurm_spec(node_count=9), ALLOC, "python3", "/w")


def test_the_plan_starts_every_process_as_a_step_with_its_settings_off_the_command_line():
    spec = with_allocation(slurm_spec(), ALLOC, "/venv/bin/python", "/w")
    plan = make_plan(spec, "r1", "/runs/r1", 30000, keys_env="SECRET-KEYS", control_address="10.0.0.254")
    assert plan.endpoints["control"] == "tcp://10.0.0.254:30000"
    for proc in plan.processes:
        assert proc.argv[:2] == ["srun", "--overlap"] and f"--nodelist={proc.host}" in proc.argv
        assert "--jobid=4242" in proc.argv and f"--job-name=rlctl-{proc.name}" in proc.argv
        assert proc.env["RLCTL_CONTROL"] == "tcp://10.0.0.254:30000"
        line = " ".join(proc.argv)
        assert "SECRET-KEYS" not in line and "RLCTL_ENDPOINTS" not in line and "RLCTL_CURVE_KEYS" not in line
    assert {h["name"]: h["via"] for h in plan.hosts} == {f"n{i}": "slurm" for i in range(1, 5)}
    # The placed job is a valid job file of its own (job.toml of the run).
    assert validate_job(resolved_dict(spec)).hosts == spec.hosts


def test_slurm_keys_are_checked_where_they_are_written():
    data = resolved_dict(load_job(REPO / "jobs" / "apex-slurm.toml"))
    for cluster, key in [({"sbatch_options": {"qos": "high; rm -rf /"}}, "cluster.sbatch_options"),
                         ({"sbatch_options": {"Bad Key": "x"}}, "cluster.sbatch_options"),
                         ({"evaluator": "middle"}, "cluster.evaluator"), ({"learner_nodes": 0}, "cluster.learner_nodes")]:
        bad = {**data, "cluster": {**data["cluster"], **cluster}}
        with pytest.raises(Exception) as info:
            validate_job(bad)
        assert key in str(info.value), str(info.value)
    with_counts = {**data, "topology": {**data["topology"], "collectors": 4}}
    with pytest.raises(Exception, match=r"topology.collectors: .*\[cluster\] places processes"):
        validate_job(with_counts)
    hosts = {**data, "hosts": [{"name": "a", "learner": True, "replay_shards": 1, "collectors": 1}]}
    with pytest.raises(Exception, match=r"hosts: .*allocation"):
        validate_job(hosts)


def test_sbatch_script_and_its_refusals(tmp_path):
    script = sbatch_script("/runs/x y", "apex", "/venv/bin/python", "/home/me", 3, {"partition": "gpu", "qos": "hi"})
    assert script.startswith("#!/bin/bash\n") and "#SBATCH --nodes=3" in script and "#SBATCH --no-kill" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --qos=hi" in script
    assert "exec /venv/bin/python -m rlctl run --slurm-run-dir '/runs/x y'" in script
    job = REPO / "jobs" / "apex-slurm.toml"
    shown = run_cli(["plan", "--sbatch", str(job), "--nodes", "4", "--time", "1:00:00", "--runs-dir", str(tmp_path)])
    assert "#SBATCH --nodes=4" in shown.stdout and "#SBATCH --time=1:00:00" in shown.stdout
    assert not list(tmp_path.iterdir())  # plan --sbatch submits and makes nothing
    out = run_cli(["run", "--sbatch", str(REPO / "jobs" / "apex.toml")], expected_exit=2)
    assert 'needs cluster.scheduler = "slurm"' in out.stderr
    out = run_cli(["plan", "--sbatch", str(job), "--partition", "a b;c"], expected_exit=2)
    assert "--partition" in out.stderr and "Traceback" not in out.stderr
    out = run_cli(["run", "--sbatch", str(job), "--time", "$(reboot)", "--runs-dir", str(tmp_path)], expected_exit=2)
    assert "--time" in out.stderr and not list(tmp_path.iterdir())  # refused before any run directory is made
    assert re.search(r"--time", run_cli(["run", "--help"]).stdout)


def test_detach_inside_salloc_is_refused_for_sbatch():
    out = run_cli(["run", "--detach", str(REPO / "jobs" / "apex-slurm.toml")], expected_exit=2)
    assert "--sbatch" in out.stderr and "Traceback" not in out.stderr


def test_the_batch_script_asks_for_the_time_limit_warning_and_requeue(tmp_path):
    script = sbatch_script("/runs/x", "apex", "/venv/bin/python", "/home/me", 3, {}, signal_grace_s=90, requeue=True)
    assert "#SBATCH --signal=B:USR1@90" in script and "#SBATCH --requeue" in script
    assert "#SBATCH --open-mode=append" in script  # each allocation's output after the last one's
    script = sbatch_script("/runs/x", "apex", "/venv/bin/python", "/home/me", 3, {}, signal_grace_s=0, requeue=False)
    assert "--signal" not in script and "#SBATCH --no-requeue" in script
    job = REPO / "jobs" / "apex-slurm.toml"
    shown = run_cli(["plan", "--sbatch", str(job), "--runs-dir", str(tmp_path)]).stdout
    assert "#SBATCH --signal=B:USR1@120" in shown and "#SBATCH --requeue" in shown  # the defaults
    bad = tmp_path / "bad.toml"
    bad.write_text(job.read_text() + "signal_grace_s = 70000\n" if "[cluster]" in job.read_text().splitlines()[-8:]
                   else job.read_text().replace("[cluster]\n", "[cluster]\nsignal_grace_s = 70000\n", 1))
    out = run_cli(["validate", str(bad)], expected_exit=2)
    assert "cluster.signal_grace_s" in out.stderr and "Traceback" not in out.stderr
