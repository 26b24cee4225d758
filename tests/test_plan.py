"""Tests for rlctl.launch.plan (JobSpec -> LaunchPlan) and rlctl.launch.hosts (local and SSH launchers)."""

from __future__ import annotations

import collections
import copy
import json
import logging
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import run_cli

from rlctl.launch.hosts import SECRET_ENV, SSHLauncher, launcher_for, ssh_hostnames
from rlctl.launch.plan import (
    CRITICAL_ROLES,
    SECRET_MASK,
    LaunchPlan,
    auto_threads,
    choose_base_port,
    core_ranges,
    default_base_port,
    make_plan,
    moved,
    pinned_cores,
    placement,
    ports_needed,
    relay_parents,
    torch_threads,
    usable_cpus,
)
from rlctl.job.load import JobFileError, load_job, validate_job
from rlctl.job.spec import JobSpec
from rlctl.launch.ports import PortLayout
from rlctl.launch.preflight import joins_later

REPO = Path(__file__).resolve().parents[1]
APEX = REPO / "jobs" / "apex.toml"
PY = "/usr/bin/python-for-tests"
RUN_ID = "apex-cartpole-20250101-120000"
RUN_DIR = "/tmp/runs/apex-cartpole-20250101-120000"
BASE = 30000
# A made-up CurveZMQ key set, shaped like the real thing (Z85 text), that must never leak.
SECRET = "rlctl-curve-v1:Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID:server=Q3[kZ}v7-f!u$rH9Aa1&gT)pXe*QmB"


def rlctl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI (`python -m rlctl ARGS`) as a user would."""
    return run_cli(list(args), expected_exit=None, env={"COLUMNS": "250", **(env or {})}, cwd=REPO)


def apex_job(**sections) -> JobSpec:
    """jobs/apex.toml with some section keys overridden: apex_job(topology={"learner_procs": 2})."""
    data = tomllib.loads(APEX.read_text())
    for section, values in sections.items():
        if values is None:
            data.pop(section, None)
        elif isinstance(values, list):
            data[section] = copy.deepcopy(values)
        else:
            data.setdefault(section, {}).update(values)
    return validate_job(data, "apex-variant.toml")


def plan_of(spec: JobSpec, base: int = BASE, keys: str = SECRET) -> LaunchPlan:
    return make_plan(spec, RUN_ID, RUN_DIR, base, python=PY, keys_env=keys)


def by_name(p: LaunchPlan) -> dict:
    return {x.name: x for x in p.processes}


def bind_ports(p: LaunchPlan) -> list[int]:
    return [int(ep.rsplit(":", 1)[1]) for x in p.processes for ep in x.binds.values()]


def endpoint_ports(p: LaunchPlan) -> list[int]:
    ep = p.endpoints
    addrs = [ep["control"], ep["weights"], ep["weights_bulk"], ep["rendezvous"]]
    addrs += [a for r in ep["replay"] for a in (r["experience"], r["sample"])]
    return [int(a.rsplit(":", 1)[1]) for a in addrs]


def arg_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


REMOTE_JOB = '''
[job]
name = "multi"
seed = 5

[env]
id = "CartPole-v1"

[algorithm]
name = "apex"

[topology]
learner_procs = 2

[network]
base_port = 42000

[[hosts]]
name = "head"
address = "localhost"
advertise_address = "192.168.1.10"
learner = true
replay_shards = 2
evaluator = true

[[hosts]]
name = "gpu-box"
address = "10.0.0.5"
user = "rl"
port = 2222
identity_file = "~/.ssh/id_ed25519"
python = "/opt/venv/bin/python"
workdir = "/srv/rl work"
collectors = 3
env = { OMP_NUM_THREADS = "2", DATA = "it's \\"quoted\\"" }

[[hosts]]
name = "cpu-box"
collectors = 2
'''


@pytest.fixture
def remote_spec(tmp_path) -> JobSpec:
    path = tmp_path / "multi.toml"
    path.write_text(REMOTE_JOB)
    return load_job(path)


# ---------------------------------------------------------------------------------------------- local job


def test_apex_processes_in_order():
    spec = load_job(APEX)
    p = plan_of(spec)
    n = spec.topology.collectors
    assert [x.name for x in p.processes] == ["replay-0", "learner-0", "evaluator-0"] + [f"collector-{i}" for i in range(n)]
    assert [(x.role, x.rank) for x in p.processes] == (
        [("replay", 0), ("learner", 0), ("evaluator", 0)] + [("collector", i) for i in range(n)])
    assert {x.host for x in p.processes} == {"localhost"}
    assert [x.name for x in p.processes if x.critical] == ["learner-0"]  # replay shards restart (snapshots)
    assert all(x.critical == (x.role in CRITICAL_ROLES) for x in p.processes)
    assert p.job == "apex-cartpole" and p.algorithm == "apex"
    assert p.run_id == RUN_ID and p.run_dir == RUN_DIR and p.base_port == BASE
    assert [h["name"] for h in p.hosts] == ["localhost"] and p.hosts[0]["local"] is True


def test_apex_argv():
    spec = load_job(APEX)
    procs = by_name(plan_of(spec))
    learner = procs["learner-0"].argv
    assert learner[:3] == [PY, "-m", "rlctl.launch.torchrun"]
    assert learner[-2:] == ["-m", "rlctl.roles.learner"]
    assert arg_after(learner, "--nproc-per-node") == str(spec.topology.learner_procs)
    assert arg_after(learner, "--nnodes") == "1"
    assert arg_after(learner, "--rdzv-id") == RUN_ID
    assert arg_after(learner, "--rdzv-endpoint") == plan_of(spec).endpoints["rendezvous"]
    assert procs["replay-0"].argv == [PY, "-m", "rlctl.roles.replay"]
    assert procs["evaluator-0"].argv == [PY, "-m", "rlctl.roles.evaluator"]
    for i in range(spec.topology.collectors):
        assert procs[f"collector-{i}"].argv == [PY, "-m", "rlctl.roles.collector"]


def test_local_python_defaults_to_host_python():
    p = make_plan(load_job(APEX), RUN_ID, RUN_DIR, BASE)
    assert all(x.argv[0] == "python3" for x in p.processes)


def test_local_job_binds_loopback_only():
    p = plan_of(load_job(APEX))
    assert p.bind_host == "127.0.0.1"
    binds = [ep for x in p.processes for ep in x.binds.values()]
    assert binds, "no process binds anything"
    for ep in binds:
        assert ep.startswith(("tcp://127.0.0.1:", "127.0.0.1:")), ep
    ep = p.endpoints
    assert ep["control"].startswith("tcp://127.0.0.1:")
    assert ep["weights"].startswith("tcp://127.0.0.1:")
    assert ep["rendezvous"].startswith("127.0.0.1:")
    assert all(r["experience"].startswith("tcp://127.0.0.1:") for r in ep["replay"])
    procs = by_name(p)
    assert set(procs["replay-0"].binds) == {"experience", "sample"}
    assert set(procs["learner-0"].binds) == {"weights", "weights_bulk", "rendezvous"}
    assert procs["collector-0"].binds == {} and procs["evaluator-0"].binds == {}


def test_process_environment():
    p = plan_of(load_job(APEX))
    for x in p.processes:
        env = x.env
        assert env["RLCTL_ROLE"] == x.role
        assert env["RLCTL_RANK"] == str(x.rank)
        assert env["RLCTL_HOST"] == x.host
        assert env["RLCTL_RUN_ID"] == RUN_ID
        assert env["RLCTL_JOB"] == f"{RUN_DIR}/job.toml"
        assert env["RLCTL_CHECKPOINT_DIR"] == f"{RUN_DIR}/checkpoints"
        assert json.loads(env["RLCTL_ENDPOINTS"]) == p.endpoints
        assert json.loads(env["RLCTL_BINDS"]) == x.binds
        assert env["RLCTL_CURVE_KEYS"] == SECRET
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


def test_secrets_masked_in_dict_and_json():
    p = plan_of(load_job(APEX))
    assert "RLCTL_CURVE_KEYS" in SECRET_ENV
    text = p.to_json()
    assert SECRET not in text
    assert SECRET[15:35] not in text
    data = json.loads(text)
    assert data == p.to_dict()
    for proc in data["processes"]:
        assert proc["env"]["RLCTL_CURVE_KEYS"] == SECRET_MASK
    assert SECRET not in json.dumps(p.to_dict())
    # Masking copies: the plan itself keeps the real value, and unmasked output has it.
    assert all(x.env["RLCTL_CURVE_KEYS"] == SECRET for x in p.processes)
    assert SECRET in p.to_json(mask_secrets=False)
    assert all(proc["env"]["RLCTL_CURVE_KEYS"] == SECRET for proc in p.to_dict(mask_secrets=False)["processes"])


def test_default_keys_env_is_masked_value():
    p = make_plan(load_job(APEX), RUN_ID, RUN_DIR, BASE)
    assert all(x.env["RLCTL_CURVE_KEYS"] == SECRET_MASK for x in p.processes)


# ---------------------------------------------------------------------------------------------- purity, sizes, ports


def test_plan_is_pure():
    a = plan_of(load_job(APEX)).to_json()
    b = plan_of(load_job(APEX)).to_json()
    assert a == b
    spec = load_job(APEX)
    assert plan_of(spec) == plan_of(spec)
    assert plan_of(spec, base=BASE + 100).to_json() != a
    assert make_plan(spec, "other-20250101-000000", RUN_DIR, BASE).to_json() != a


def test_learner_procs_sets_replay_shards_by_default():
    spec = apex_job(topology={"learner_procs": 2})
    assert spec.replay_shard_count == 2
    p = plan_of(spec)
    names = [x.name for x in p.processes]
    assert names[:3] == ["replay-0", "replay-1", "learner-0"]
    assert [x.name for x in p.processes if x.role == "learner"] == ["learner-0"]  # one node, 2 procs
    assert arg_after(by_name(p)["learner-0"].argv, "--nproc-per-node") == "2"
    assert len(p.endpoints["replay"]) == 2


def test_explicit_replay_shards():
    spec = apex_job(topology={"learner_procs": 2, "replay_shards": 3})
    p = plan_of(spec)
    replays = [x for x in p.processes if x.role == "replay"]
    assert [x.name for x in replays] == ["replay-0", "replay-1", "replay-2"]
    assert len(p.endpoints["replay"]) == 3
    experience = [json.loads(x.env["RLCTL_BINDS"])["experience"] for x in replays]
    assert len(set(experience)) == 3


def test_no_evaluator():
    p = plan_of(apex_job(topology={"evaluator": False, "collectors": 1}))
    assert [x.name for x in p.processes] == ["replay-0", "learner-0", "collector-0"]


def test_many_collectors():
    p = plan_of(apex_job(topology={"collectors": 7}))
    assert [x.name for x in p.processes if x.role == "collector"] == [f"collector-{i}" for i in range(7)]


@pytest.mark.parametrize("topology", [{}, {"learner_procs": 2}, {"replay_shards": 3}, {"replay_shards": 5, "collectors": 9}])
def test_ports_distinct_and_in_range(topology):
    spec = apex_job(topology=topology)
    p = plan_of(spec)
    need = ports_needed(spec)
    binds = bind_ports(p)
    eps = endpoint_ports(p)
    assert len(binds) == len(set(binds)), binds
    assert len(eps) == len(set(eps)), eps
    assert len(eps) <= need  # the range may hold spares
    for port in binds + eps:
        assert BASE <= port < BASE + need
    assert p.ports() == sorted(set(binds))
    assert set(binds) <= set(eps)


def test_choose_base_port_uses_configured_port():
    spec = apex_job(network={"base_port": 45000})
    assert choose_base_port(spec) == 45000
    assert plan_of(spec, base=choose_base_port(spec)).base_port == 45000


def test_choose_base_port_default():
    spec = load_job(APEX)
    assert default_base_port(spec) == default_base_port(load_job(APEX))
    base = choose_base_port(spec)
    assert 20000 <= base and (base - 20000) % 16 == 0
    # Below Linux's ephemeral ports, which any outgoing connection may hold for a moment, for every job name.
    for name in [f"job-{i}" for i in range(500)]:
        named = apex_job(job={"name": name}, topology={"learner_procs": 2, "replay_shards": 8})
        assert 20000 <= default_base_port(named) and default_base_port(named) + ports_needed(named) <= 32768


def test_placement_without_hosts():
    spec = apex_job(topology={"learner_procs": 2, "collectors": 4, "evaluator": False})
    (host,) = placement(spec)
    assert host.is_local and host.learner and not host.evaluator
    assert host.collectors == 4 and host.replay_shards == 2


# ---------------------------------------------------------------------------------------------- [[hosts]] and SSH


def test_remote_plan_processes(remote_spec):
    p = plan_of(remote_spec, base=choose_base_port(remote_spec))
    assert p.base_port == 42000
    hosts = {x.name: x.host for x in p.processes}
    assert hosts == {
        "replay-0": "head", "replay-1": "head", "learner-0": "head", "evaluator-0": "head",
        "relay-0": "gpu-box", "relay-1": "cpu-box",
        "collector-0": "gpu-box", "collector-1": "gpu-box", "collector-2": "gpu-box",
        "collector-3": "cpu-box", "collector-4": "cpu-box",
    }
    assert [x.name for x in p.processes][:4] == ["replay-0", "replay-1", "learner-0", "evaluator-0"]
    assert arg_after(by_name(p)["learner-0"].argv, "--nproc-per-node") == "2"
    rows = {h["name"]: h for h in p.hosts}
    assert rows["head"]["local"] is True and rows["gpu-box"]["local"] is False
    assert rows["gpu-box"]["destination"] == "10.0.0.5" and rows["cpu-box"]["destination"] == "cpu-box"


def test_every_other_host_with_two_weight_takers_gets_a_relay_and_its_processes_subscribe_there(remote_spec):
    p = make_plan(remote_spec, RUN_ID, RUN_DIR, 42000, python=PY, keys_env=SECRET, board_token="t0k")
    procs = by_name(p)
    relays = {x.host: x for x in p.processes if x.role == "relay"}
    assert [(x.name, x.host) for x in relays.values()] == [("relay-0", "gpu-box"), ("relay-1", "cpu-box")]
    for host, relay in relays.items():
        board, via = relay.env["RLCTL_WEIGHT_BOARD"], relay.binds["weights"]
        assert via == f"ipc:///tmp/rlctl-t0k/relay-{relay.rank}.sock" and board.startswith("/dev/shm/")
        assert relay.binds["control"] == f"ipc:///tmp/rlctl-t0k/relay-{relay.rank}-control.sock"
        assert relay.command[-1] == "rlctl.roles.relay" and "RLCTL_WEIGHTS_VIA" not in relay.env
        assert "RLCTL_CONTROL_VIA" not in relay.env  # the relay itself reports to the supervisor
        takers = [x for x in p.processes if x.host == host and x.role == "collector"]
        assert takers and all(x.env["RLCTL_WEIGHT_BOARD"] == board and x.env["RLCTL_WEIGHTS_VIA"] == via
                              and x.env["RLCTL_CONTROL_VIA"] == relay.binds["control"] for x in takers)
    # Two hosts, two boards and sockets (test hosts share one machine's /dev/shm and /tmp); none is the head's.
    assert len({r.env["RLCTL_WEIGHT_BOARD"] for r in relays.values()} | {procs["evaluator-0"].env["RLCTL_WEIGHT_BOARD"]}) == 3
    assert not any("RLCTL_WEIGHTS_VIA" in x.env or "RLCTL_CONTROL_VIA" in x.env for x in p.processes
                   if x.host == "head" or x.role in ("learner", "replay"))
    assert p.ports() == sorted(p.ports()) and all(isinstance(port, int) for port in p.ports())
    # A collector moved off its host (the host was lost) takes weights from learner rank 0 again.
    target = next(h for h in remote_spec.hosts if h.name == "cpu-box")
    gone = moved(procs["collector-0"], target, "cpu-box")
    assert "RLCTL_WEIGHTS_VIA" not in gone.env and "RLCTL_WEIGHT_BOARD" not in gone.env
    assert "RLCTL_CONTROL_VIA" not in gone.env  # ... and reports to the supervisor


def test_relays_past_the_fanout_take_weights_from_a_relay_above_them(remote_spec):
    # Each sender (rank 0: None) has at most `fanout` relays below it, and each relay's sender comes before it.
    assert relay_parents(7, 2) == [None, None, 0, 0, 1, 1, 2]
    assert relay_parents(3, 16) == [None] * 3
    for n, fanout in ((100, 8), (1000, 16), (5, 1)):
        parents = relay_parents(n, fanout)
        counts = collections.Counter(parents)
        assert max(counts.values()) <= fanout and all(q is None or q < k for k, q in enumerate(parents))
    spec = remote_spec.model_copy(update={"network": remote_spec.network.model_copy(update={"relay_fanout": 1})})
    p = make_plan(spec, RUN_ID, RUN_DIR, 42000, python=PY, keys_env=SECRET, board_token="t0k")
    procs = by_name(p)
    above, below = procs["relay-0"], procs["relay-1"]
    port, bulk = PortLayout(spec, 42000).relay_tree, PortLayout(spec, 42000).relay_tree_bulk
    # relay-0 (gpu-box) binds the tree's port besides its host's socket; relay-1 (cpu-box) subscribes there, and
    # knows rank 0's endpoint to fall back on; relay-0 takes rank 0's.
    assert above.binds["weights_tree"] == f"tcp://0.0.0.0:{port}" and "RLCTL_WEIGHTS_VIA" not in above.env
    assert below.env["RLCTL_WEIGHTS_VIA"] == f"tcp://10.0.0.5:{port}" and "weights_tree" not in below.binds
    assert port in p.ports() and port < 42000 + ports_needed(spec)
    # ... and the sealed versions' bulk socket beside it (rlctl.net.sealed).
    assert above.binds["weights_tree_bulk"] == f"tcp://0.0.0.0:{bulk}" and "RLCTL_WEIGHTS_BULK_VIA" not in above.env
    assert below.env["RLCTL_WEIGHTS_BULK_VIA"] == f"tcp://10.0.0.5:{bulk}" and bulk in p.ports()
    assert bulk < 42000 + ports_needed(spec) and bulk not in (port, *endpoint_ports(p))
    # The collectors under relay-1 still read their own host's board.
    assert procs["collector-3"].env["RLCTL_WEIGHTS_VIA"] == below.binds["weights"]
    # The default fanout (16) keeps both hosts' relays under rank 0.
    assert not any("weights_tree" in x.binds for x in plan_of(remote_spec).processes)


def test_a_host_with_one_weight_taker_or_only_central_collectors_gets_no_relay(remote_spec):
    one = remote_spec.model_copy(update={"hosts": [h.model_copy(update={"collectors": min(h.collectors, 1)})
                                                   for h in remote_spec.hosts]})
    assert not any(x.role == "relay" for x in plan_of(one).processes)
    # Central inference: collectors ask the servers (on the learner host) and take no weights themselves.
    data = tomllib.loads(REMOTE_JOB)
    data["topology"]["inference"] = "central"
    central = validate_job(data, "central.toml")
    assert not any(x.role == "relay" for x in plan_of(central).processes)


def test_remote_binds_not_loopback(remote_spec):
    p = plan_of(remote_spec)
    assert p.bind_host != "127.0.0.1"
    binds = [ep for x in p.processes for ep in x.binds.values()]
    assert binds
    assert not any("127.0.0.1" in ep for ep in binds), binds
    # Others reach the head at its advertised address.
    assert p.endpoints["weights"].startswith("tcp://192.168.1.10:")
    assert p.endpoints["rendezvous"].startswith("192.168.1.10:")
    assert all(r["experience"].startswith("tcp://192.168.1.10:") for r in p.endpoints["replay"])


def test_local_hosts_in_multi_host_job_run_directly(remote_spec):
    procs = by_name(plan_of(remote_spec))
    assert procs["replay-0"].argv == [PY, "-m", "rlctl.roles.replay"]
    assert procs["learner-0"].argv[:3] == [PY, "-m", "rlctl.launch.torchrun"]


def test_ssh_argv_for_remote_host(remote_spec):
    procs = by_name(plan_of(remote_spec))
    for name in ("collector-0", "collector-1", "collector-2"):
        x = procs[name]
        argv = x.argv
        assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
        assert arg_after(argv, "-p") == "2222"
        assert arg_after(argv, "-i") == "~/.ssh/id_ed25519"
        assert arg_after(argv, "-l") == "rl"
        sep = argv.index("--")
        assert argv[sep - 1] == "10.0.0.5"
        assert len(argv) == sep + 2, "the remote command must be one word for ssh"
        remote = shlex.split(argv[-1])
        assert remote[:4] == ["cd", "/srv/rl work", "&&", "exec"]
        assert remote[4] == "env"
        # The role runs inside rlctl.launch.remote, which ties its process group to the session.
        py = remote.index("/opt/venv/bin/python")
        assert remote[py:py + 5] == ["/opt/venv/bin/python", "-m", "rlctl.launch.remote", "run", "--"]
        assert remote[py + 5:] == ["/opt/venv/bin/python", "-m", "rlctl.roles.collector"]
        assignments = dict(a.split("=", 1) for a in remote[5:py])
        # Control messages travel over the session: a forwarded Unix socket, unique per process and start.
        assert assignments["RLCTL_CONTROL"].startswith("ipc:///tmp/rlctl-") and "{attempt}" in assignments["RLCTL_CONTROL"]
        control_port = int(plan_of(remote_spec).endpoints["control"].rsplit(":", 1)[1])
        assert arg_after(argv, "-R") == f"{assignments['RLCTL_CONTROL'][len('ipc://'):]}:127.0.0.1:{control_port}"
        assert "ExitOnForwardFailure=yes" in argv
        # The job file arrives on stdin and is kept under the host's workdir.
        assert assignments["RLCTL_JOB"] == f".rlctl/runs/{RUN_ID}/job.toml"
        assert assignments["RLCTL_CHECKPOINT_DIR"] == f".rlctl/runs/{RUN_ID}/checkpoints"
        assert x.remote
        assert assignments["RLCTL_ROLE"] == "collector"
        assert assignments["RLCTL_RANK"] == name.split("-")[1]
        assert assignments["RLCTL_HOST"] == "gpu-box"
        # The host's own env may hold secrets: kept off the command line, it travels down the session's stdin.
        assert "OMP_NUM_THREADS" not in assignments and "DATA" not in assignments
        assert x.env["OMP_NUM_THREADS"] == "2" and x.env["DATA"] == 'it\'s "quoted"'  # the host's env wins
        assert x.secret_keys == ("DATA", "OMP_NUM_THREADS")
        assert json.loads(assignments["RLCTL_ENDPOINTS"]) == plan_of(remote_spec).endpoints
        assert "RLCTL_CURVE_KEYS" not in assignments
        assert x.env["RLCTL_CURVE_KEYS"] == SECRET  # it travels out of band (stdin), not on the command line


def test_ssh_argv_minimal_host(remote_spec):
    procs = by_name(plan_of(remote_spec))
    argv = procs["collector-3"].argv
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
    for flag in ("-p", "-i", "-l"):
        assert flag not in argv
    assert argv[argv.index("--") - 1] == "cpu-box"
    remote = shlex.split(argv[-1])
    assert remote[:2] == ["exec", "env"]  # no workdir: no cd
    assert remote[-8:] == ["python3", "-m", "rlctl.launch.remote", "run", "--", "python3", "-m", "rlctl.roles.collector"]


def test_secret_never_on_any_command_line(remote_spec):
    p = plan_of(remote_spec)
    for x in p.processes:
        joined = "\0".join(x.argv)
        assert SECRET not in joined
        assert "RLCTL_CURVE_KEYS" not in joined
    assert SECRET not in p.to_json()


def test_launcher_selection(remote_spec):
    kinds = {h.name: launcher_for(h).remote for h in remote_spec.hosts}
    assert kinds == {"head": False, "gpu-box": True, "cpu-box": True}
    host = remote_spec.hosts[1]
    assert SSHLauncher().ssh_prefix(host)[-1] == "10.0.0.5"


def test_learner_nodes_with_their_own_process_counts(tmp_path):
    """Ranks are numbered node after node (torchrun's static rendezvous), each node with its own learner_procs."""
    text = REMOTE_JOB.replace("replay_shards = 2\nevaluator = true", "replay_shards = 2\nevaluator = true\nlearner_procs = 1")
    text = text.replace('name = "cpu-box"\n', 'name = "cpu-box"\nlearner = true\nlearner_procs = 3\n')
    text = text.replace('name = "apex"', 'name = "appo"').replace("replay_shards = 2\n", "")
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    spec = load_job(path)
    assert spec.learner_node_procs == [1, 3] and spec.learner_ranks == 4
    assert [spec.learner_node_of(r) for r in range(4)] == [0, 1, 1, 1]
    p = plan_of(spec)
    head, second = (x for x in p.processes if x.role == "learner")
    assert (head.host, second.host) == ("head", "cpu-box")
    assert arg_after(head.argv, "--nproc-per-node") == "1" and arg_after(head.argv, "--nnodes") == "2"
    remote = shlex.split(second.argv[-1])
    assert arg_after(remote, "--nproc-per-node") == "3" and arg_after(remote, "--node-rank") == "1"
    assert arg_after(remote, "--rdzv-backend") == "static"
    assert arg_after(remote, "--rdzv-endpoint") == p.endpoints["rendezvous"]
    assert sorted(head.binds) == ["rendezvous", "rollouts-0", "weights", "weights_bulk"]
    assert sorted(k for k in second.binds if k.startswith("rollouts-")) == ["rollouts-1", "rollouts-2", "rollouts-3"]
    hosts = [ep.split("//")[1].rsplit(":", 1)[0] for ep in p.endpoints["rollouts"]]
    assert hosts == ["192.168.1.10", "cpu-box", "cpu-box", "cpu-box"]
    bad = text.replace('name = "gpu-box"\n', 'name = "gpu-box"\nlearner_procs = 2\n')
    path.write_text(bad)
    with pytest.raises(JobFileError, match="hosts\\[1\\].learner_procs"):
        load_job(path)


def test_elastic_learner_nodes_rendezvous_over_c10d_on_the_head_and_only_the_head_is_critical(tmp_path):
    """topology.min_learner_nodes below the learner nodes: torchrun's elastic c10d rendezvous (`--nnodes MIN:MAX`),
    its store on the head (is_host there only), each node's own address as its rendezvous address; the run ends
    with the head's learner only. A minimum above the nodes is refused; rollout algorithms are elastic too."""
    text = REMOTE_JOB.replace('name = "cpu-box"\n', 'name = "cpu-box"\nlearner = true\n')
    path = tmp_path / "elastic.toml"
    path.write_text(text.replace("[topology]\n", "[topology]\nmin_learner_nodes = 1\n"))
    spec = load_job(path)
    assert spec.elastic_learners
    p = plan_of(spec)
    head, second = (x for x in p.processes if x.role == "learner")
    remote = shlex.split(second.argv[-1])
    for argv, is_host, addr in ((head.argv, 1, "192.168.1.10"), (remote, 0, "cpu-box")):
        assert arg_after(argv, "--nnodes") == "1:2" and arg_after(argv, "--rdzv-backend") == "c10d"
        assert "--node-rank" not in argv and arg_after(argv, "--rdzv-endpoint") == p.endpoints["rendezvous"]
        assert arg_after(argv, "--local-addr") == addr
        assert arg_after(argv, "--rdzv-conf").startswith(f"is_host={is_host},")
    assert (head.critical, second.critical) == (True, False)
    # The run may start without a host SSH cannot reach if it runs only such a node (rlctl.launch.preflight): the
    # node joins later. cpu-box runs collectors too: not so.
    assert joins_later(spec, p) == set()
    alone = tmp_path / "alone.toml"
    alone.write_text(REMOTE_JOB.replace('name = "cpu-box"\ncollectors = 2\n', 'name = "cpu-box"\nlearner = true\n')
                     .replace("[topology]\n", "[topology]\nmin_learner_nodes = 1\n"))
    assert joins_later(load_job(alone), plan_of(load_job(alone))) == {"cpu-box"}
    path.write_text(text.replace("[topology]\n", "[topology]\nmin_learner_nodes = 2\n"))
    fixed = load_job(path)
    assert not fixed.elastic_learners and all(x.critical for x in plan_of(fixed).processes if x.role == "learner")
    assert joins_later(fixed, plan_of(fixed)) == set()
    path.write_text(text.replace("[topology]\n", "[topology]\nmin_learner_nodes = 3\n"))
    with pytest.raises(JobFileError, match="topology.min_learner_nodes: 3 is more than the job's 2 learner nodes"):
        load_job(path)
    rollouts = text.replace('name = "apex"', 'name = "appo"').replace("replay_shards = 2\n", "")
    path.write_text(rollouts.replace("[topology]\n", "[topology]\nmin_learner_nodes = 1\n"))
    assert load_job(path).elastic_learners


def test_hosts_are_reached_where_their_ssh_destination_resolves(tmp_path):
    """Without advertise_address a host is reached at the host name ssh would connect to (`ssh -G`: aliases and
    HostName options resolved from the configuration, nothing contacted)."""
    text = REMOTE_JOB.replace('name = "cpu-box"\n', 'name = "cpu-box"\nssh_options = { HostName = "cpu-7.example" }\n'
                              'replay_shards = 1\n')
    path = tmp_path / "alias.toml"
    path.write_text(text)
    spec = load_job(path)
    addresses = ssh_hostnames([h for h in spec.hosts if not h.is_local])
    assert addresses == {"gpu-box": "10.0.0.5", "cpu-box": "cpu-7.example"}
    p = make_plan(spec, RUN_ID, RUN_DIR, BASE, python=PY, addresses=addresses)
    assert p.endpoints["replay"][-1]["experience"].startswith("tcp://cpu-7.example:")
    assert {h["name"]: h["address"] for h in p.hosts}["cpu-box"] == "cpu-7.example"


def test_remote_plan_is_pure(remote_spec):
    assert plan_of(remote_spec).to_json() == plan_of(remote_spec).to_json()


# ---------------------------------------------------------------------------------------------- CLI


def plan_rows(out: str) -> dict[str, dict[str, str]]:
    """`rlctl plan`'s process table (as printed to a pipe: one line a row), process -> column -> cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("process "))
    columns = lines[start].split()
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(columns), (columns, line)
        rows[cells[0]] = dict(zip(columns, cells))
    return rows


def test_cli_plan_text(tmp_path):
    runs = tmp_path / "runs"
    proc = rlctl("plan", "jobs/apex.toml", "--runs-dir", str(runs))
    assert proc.returncode == 0, proc.stderr
    rows = plan_rows(proc.stdout)
    assert list(rows) == ["replay-0", "learner-0", "evaluator-0", "collector-0", "collector-1"]
    assert rows["learner-0"]["runs"] == "rlctl.roles.learner via torchrun" and rows["learner-0"]["role"] == "learner"
    assert rows["collector-1"]["runs"] == "rlctl.roles.collector" and rows["collector-1"]["rank"] == "1"
    assert re.fullmatch(r"experience:\d+ sample:\d+", rows["replay-0"]["ports"]) and rows["collector-0"]["ports"] == "-"
    assert "$ " not in proc.stdout and "RLCTL_ENDPOINTS" not in proc.stdout  # commands and env: --verbose
    verbose = rlctl("plan", "jobs/apex.toml", "--verbose", "--runs-dir", str(runs)).stdout
    assert "--start-method fork -m rlctl.roles.learner" in verbose and "  RLCTL_ENDPOINTS={" in verbose
    assert "Traceback" not in proc.stderr
    assert not runs.exists(), "plan must not create anything"


def test_plan_at_80_columns_splits_no_word_across_lines(tmp_path):
    """Issue 30: `rlctl plan` wrapped mid-token ("binds 127." / "0.0.1") and printed ~900-character ssh lines."""
    from rlctl.launch.pipeline import plan_to_show
    from rlctl.views.plan_view import plan_view

    for job in (APEX, REPO / "jobs" / "apex-hosts.toml"):
        spec, p = plan_to_show(load_job(job), tmp_path / "runs")
        words = {w for line in _plain(plan_view(p, spec), 400).splitlines() for w in line.split()}
        text = _plain(plan_view(p, spec), 80)
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80, text
        # Every word of a line is a word of the unwrapped plan: none was cut in two.
        assert all(w in words for line in lines for w in line.split() if w.strip("─")), text
        for x in p.processes:  # each process's port numbers (a relay's socket path) are in the table, whole
            for channel, address in x.binds.items():
                if address.startswith("ipc://"):
                    assert f"{channel}:{address[len('ipc://'):]}" in text.split(), text
                else:
                    assert re.search(rf"\b{address.rpartition(':')[2]}\b", text)
        assert "binds 127.0.0.1," in text or "binds 0.0.0.0," in text
        assert "ssh -o" not in text  # full commands only with --verbose


def _plain(renderable, width: int) -> str:
    import io

    from rich.console import Console

    con = Console(width=width, record=True, file=io.StringIO())
    con.print(renderable)
    return con.export_text()


def test_cli_plan_json(tmp_path):
    proc = rlctl("plan", "--json", "jobs/apex.toml", "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [x["name"] for x in data["processes"]] == ["replay-0", "learner-0", "evaluator-0", "collector-0", "collector-1"]
    assert data["bind_host"] == "127.0.0.1"
    assert data["run_dir"].startswith(str(tmp_path / "runs"))
    for x in data["processes"]:
        for key in SECRET_ENV:
            assert x["env"][key] == SECRET_MASK
        assert x["env"]["RLCTL_ROLE"] == x["role"]
    learner = next(x for x in data["processes"] if x["role"] == "learner")
    assert "rlctl.launch.torchrun" in learner["argv"] and learner["argv"][-1] == "rlctl.roles.learner"


def test_cli_plan_remote_job_shows_ssh(tmp_path):
    job = tmp_path / "multi.toml"
    job.write_text(REMOTE_JOB)
    proc = rlctl("plan", "--json", str(job), "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    collectors = [x for x in data["processes"] if x["role"] == "collector"]
    assert len(collectors) == 5 and all(x["argv"][0] == "ssh" for x in collectors)
    assert data["base_port"] == 42000


def test_cli_plan_bad_job(tmp_path):
    job = tmp_path / "bad.toml"
    job.write_text(APEX.read_text().replace("[replay]", "[replay]\nalhpa = 1"))
    proc = rlctl("plan", str(job))
    assert proc.returncode == 2
    assert "replay.alhpa" in proc.stderr and "Traceback" not in proc.stderr


def test_weight_board_for_subscribers_on_the_learner_host_only(remote_spec):
    from rlctl.launch.remote import weight_board_file

    board = weight_board_file(RUN_ID, RUN_DIR)
    assert board.startswith(f"/dev/shm/rlctl-{RUN_ID}-") and board != weight_board_file(RUN_ID, RUN_DIR + "2")
    local = by_name(plan_of(load_job(APEX)))
    assert {n for n, x in local.items() if x.env.get("RLCTL_WEIGHT_BOARD") == board} == {
        n for n in local if not n.startswith("replay")}  # learner, evaluator and collectors; shards take no weights
    multi = by_name(plan_of(remote_spec))
    # The head holds learner rank 0 and the evaluator; collectors elsewhere get weights through their host's relay.
    assert {n for n, x in multi.items() if x.env.get("RLCTL_WEIGHT_BOARD") == board} == {"learner-0", "evaluator-0"}
    no_local_subscriber = remote_spec.model_copy(update={"hosts": [
        h.model_copy(update={"evaluator": False}) for h in remote_spec.hosts]})
    assert not any(x.env.get("RLCTL_WEIGHT_BOARD") == board for x in plan_of(no_local_subscriber).processes)


def test_asynchronous_rollout_batches_keep_their_size_and_a_lag_past_the_bound_is_warned():
    from rlctl.launch.plan import job_warnings

    appo = load_job(REPO / "jobs" / "appo.toml")
    assert appo.algorithm.rollouts_per_update(8) == 2 and appo.algorithm.rollouts_per_update(1) == 16
    assert job_warnings(appo) == []
    wide = validate_job({"job": {"name": "w"}, "env": {"id": "CartPole-v1", "envs_per_collector": 8},
                         "algorithm": {"name": "appo", "rollouts_per_batch": 1, "max_policy_lag": 4},
                         "topology": {"collectors": 24}})
    (warning,) = job_warnings(wide)
    assert "rollouts arrive about 24 versions old, past algorithm.max_policy_lag = 4" in warning
    # The shipped APPO job with 24 collectors x 1 env: batch_steps gathers 16 rollouts per update, lag about 1.5.
    many = validate_job({**tomllib.loads((REPO / "jobs" / "appo.toml").read_text()),
                         "topology": {"collectors": 24}, "env": {"id": "CartPole-v1", "envs_per_collector": 1}})
    assert many.algorithm.rollouts_per_update(1) == 16 and job_warnings(many) == []
    assert job_warnings(load_job(REPO / "jobs" / "ppo.toml")) == []


def test_machine_warnings_name_the_cause_and_a_topology_that_fits():
    from rlctl.launch.plan import machine_warnings

    crowded = validate_job({"job": {"name": "c"}, "env": {"id": "CartPole-v1", "envs_per_collector": 2},
                            "algorithm": {"name": "apex"}, "topology": {"collectors": 24}})
    (warning,) = machine_warnings(crowded, cpus=2)
    assert "27 processes on this machine's 2 cores" in warning and "24 collectors" in warning
    assert "The same 48 envs" in warning and "collectors = 2, envs_per_collector = 24" in warning
    assert machine_warnings(crowded, cpus=16) == []
    shipped = load_job(REPO / "jobs" / "apex.toml")
    assert machine_warnings(shipped, cpus=2) == []
    wide = validate_job({"job": {"name": "w"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"},
                         "topology": {"learner_procs": 4, "collectors": 4}})
    assert any("4 learner processes" in w for w in machine_warnings(wide, cpus=2))
    remote_only = validate_job({"job": {"name": "r"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "apex"},
                                "hosts": [{"name": "far", "learner": True, "replay_shards": 1, "collectors": 40}]})
    assert machine_warnings(remote_only, cpus=2) == []


def test_torch_threads_are_chosen_per_process_and_said_in_the_plan(remote_spec):
    threads = {x.name: x.env["RLCTL_TORCH_THREADS"] for x in plan_of(remote_spec).processes}
    # Learners on this machine: its CPUs less the 3 other processes placed here (2 shards, the evaluator), over 2
    # ranks; everything else one thread.
    assert threads.pop("learner-0") == str(auto_threads(usable_cpus(), 3, 2))
    assert set(threads.values()) == {"1"}
    # A learner host reached over SSH counts its own cores when the learner starts there.
    text = REMOTE_JOB.replace('learner = true\n', '').replace('collectors = 2\n', 'collectors = 2\nlearner = true\n')
    spec = validate_job(tomllib.loads(text), "multi.toml")
    assert by_name(plan_of(spec))["learner-0"].env["RLCTL_TORCH_THREADS"] == "auto:2"  # its 2 collectors
    assert torch_threads("auto:2", 1) == max(1, usable_cpus() - 2) and torch_threads("auto:0", 64) == 1
    assert torch_threads("3") == 3 and torch_threads("0") == torch_threads("junk") == torch_threads(None) == 1
    # A number in the job wins.
    spec = apex_job(topology={"learner_threads": 6})
    assert by_name(plan_of(spec))["learner-0"].env["RLCTL_TORCH_THREADS"] == "6"
    rows = plan_rows(rlctl("plan", str(APEX)).stdout)
    assert rows["learner-0"]["threads"] == str(auto_threads(usable_cpus(), 4, 1))
    assert rows["collector-0"]["threads"] == "1" and rows["collector-0"]["host"] == "localhost"


def test_dedicated_learner_cores_split_a_hosts_cpus_between_learner_ranks_and_the_rest():
    cpus = [0, 1, 2, 3, 4, 5, 6, 7]
    # One rank of 1 thread: core 0 for it, the other seven for everyone else.
    assert pinned_cores("1:1", "learner", 0, cpus) == [[0]]
    assert pinned_cores("1:1", "collector", 0, cpus) == [[1, 2, 3, 4, 5, 6, 7]]
    # Two ranks of 3: 0-2 and 3-5, the rest 6-7; the plan asks for every rank's set at once (local_rank -1).
    assert pinned_cores("2:3", "learner", 1, cpus) == [[3, 4, 5]]
    assert pinned_cores("2:3", "learner", -1, cpus) == [[0, 1, 2], [3, 4, 5]]
    assert pinned_cores("2:3", "replay", 0, cpus) == [[6, 7]]
    # auto threads count on the host: 8 cpus less 4 other processes over 2 ranks = 2 each.
    assert pinned_cores("2:auto:4", "learner", 1, cpus) == [[2, 3]]
    assert pinned_cores("2:auto:4", "evaluator", 0, cpus) == [[4, 5, 6, 7]]
    # The CPUs this process may use, not 0..n-1 (a taskset or a Slurm cgroup gave it these).
    assert pinned_cores("1:1", "learner", 0, [4, 9]) == [[4]] and pinned_cores("1:1", "x", 0, [4, 9]) == [[9]]
    # Nothing left for the others, a rank past the host's, junk: nothing pinned.
    assert pinned_cores("2:1", "learner", 0, [0, 1]) is None and pinned_cores("1:2", "collector", 0, [0, 1]) is None
    assert pinned_cores("1:1", "learner", 1, cpus) is None
    for junk in (None, "", "x", "0:1", ":1", "-1:1", "1"):
        assert pinned_cores(junk, "learner", 0, cpus) is None, junk
    assert core_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and core_ranges([3]) == "3"


def test_dedicated_learner_cores_are_given_to_the_learner_hosts_processes_and_said_in_the_plan(tmp_path):
    spec = apex_job(topology={"learner_cores": "dedicated", "learner_threads": 1, "collectors": 1})
    env = {x.name: x.env.get("RLCTL_LEARNER_CORES") for x in plan_of(spec).processes}
    assert set(env.values()) == {"1:1"}, env
    assert "RLCTL_LEARNER_CORES" not in by_name(plan_of(apex_job()))["learner-0"].env  # shared: the default
    job = tmp_path / "cores.toml"
    job.write_text('[job]\nname = "c"\n[env]\nid = "CartPole-v1"\n[algorithm]\nname = "appo"\n'
                   '[topology]\ncollectors = 1\nevaluator = false\nlearner_threads = 1\n'
                   'learner_cores = "dedicated"\n')
    out = rlctl("plan", str(job))
    assert out.returncode == 0, out.stderr
    if usable_cpus() > 1:
        cpus = sorted(os.sched_getaffinity(0))
        rows = plan_rows(out.stdout)
        assert rows["learner-0"]["threads"] == "1" and rows["learner-0"]["cores"] == str(cpus[0])
        assert rows["collector-0"]["cores"] == core_ranges(cpus[1:])
    # Learner hosts reached over SSH: the rule, counted there; hosts without a learner pin nothing.
    text = REMOTE_JOB.replace("learner_procs = 2\n", 'learner_procs = 2\nlearner_cores = "dedicated"\n')
    spec = validate_job(tomllib.loads(text.replace('learner = true\n', '').replace(
        'collectors = 2\n', 'collectors = 2\nlearner = true\n')), "multi.toml")
    procs = by_name(plan_of(spec))
    assert procs["learner-0"].env["RLCTL_LEARNER_CORES"] == "2:auto:2"
    assert procs["collector-3"].env["RLCTL_LEARNER_CORES"] == "2:auto:2"  # on the learner's host, cpu-box
    assert "RLCTL_LEARNER_CORES" not in procs["collector-0"].env and "RLCTL_LEARNER_CORES" not in procs["replay-0"].env


def test_dedicated_cores_that_leave_nothing_for_the_others_are_a_warning():
    from rlctl.launch.plan import machine_warnings

    wide = validate_job({"job": {"name": "w"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"},
                         "topology": {"learner_procs": 2, "collectors": 2, "learner_cores": "dedicated"}})
    (warning,) = [w for w in machine_warnings(wide, cpus=2) if "learner_cores" in w]
    assert "2 learner rank(s) x 1 torch thread(s) would take all of this machine's 2 cores" in warning
    assert not [w for w in machine_warnings(wide, cpus=8) if "learner_cores" in w]


@pytest.mark.parametrize("job", sorted(p.name for p in (REPO / "jobs").glob("*.toml") if "[sweep]" not in p.read_text()))
def test_every_shipped_job_validates_and_plans(job):
    spec = load_job(REPO / "jobs" / job)
    p = plan_of(spec, base=choose_base_port(spec))
    assert {x.role for x in p.processes} >= {"learner", "collector"}


def test_the_shipped_sweep_has_its_eight_trials_each_a_job_that_plans():
    from rlctl.job.sweep_spec import load_sweep

    sweep = load_sweep(REPO / "jobs" / "sweep-ppo.toml")
    assert len(sweep.trials) == 8 and len({(t.values["algorithm.lr"], t.seed) for t in sweep.trials}) == 8
    for spec in sweep.jobs:
        assert {x.role for x in plan_of(spec, base=choose_base_port(spec)).processes} >= {"learner", "collector"}


def test_the_multi_host_example_places_learner_and_collectors_on_their_hosts():
    out = rlctl("plan", str(REPO / "jobs" / "apex-hosts.toml"))
    assert out.returncode == 0, out.stderr
    assert "hosts: learner (ssh gpu-01.cluster.example), cpu-a (ssh rl@cpu-01.cluster.example), cpu-b (ssh " in out.stdout
    p = plan_of(load_job(REPO / "jobs" / "apex-hosts.toml"))
    assert {x.name: x.host for x in p.processes if x.role != "collector"} == {
        "replay-0": "learner", "learner-0": "learner", "evaluator-0": "learner", "relay-0": "cpu-a", "relay-1": "cpu-b"}
    assert [x.host for x in p.processes if x.role == "collector"] == ["cpu-a"] * 4 + ["cpu-b"] * 4
    assert all(x.remote for x in p.processes)
    assert rlctl("validate", str(REPO / "jobs" / "apex-hosts.toml")).returncode == 0


@pytest.mark.parametrize("algo", ["apex", "ppo", "appo", "impala", "r2d2"])
def test_init_prints_a_commented_job_with_every_key_that_validates_as_written(algo, tmp_path):
    from rlctl.job.jobref import SECTIONS

    out = rlctl("init", "--algo", algo)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "job.toml"
    path.write_text(out.stdout)
    spec = load_job(path)
    assert spec.algorithm.name == algo and spec.env.id == "CartPole-v1" and not spec.hosts
    # Every key of every section the job has is there, set or (unset by default) commented out.
    for header, model, skip in SECTIONS:
        if header.startswith(("[algorithm]", "[[hosts]]")) or (header == "[replay]" and algo not in ("apex", "r2d2")):
            continue
        for key in set(model.model_fields) - set(skip):
            assert f"\n{key} = " in out.stdout or f"\n# {key} =" in out.stdout, (header, key)
    assert all(f"\n{key} = " in out.stdout or f"\n# {key} =" in out.stdout for key in type(spec.algorithm).model_fields)
    assert f'[algorithm]\nname = "{algo}"' in out.stdout
    assert out.stdout.count("\n# ") > 50  # each key's doc
    hosted = rlctl("init", "--algo", algo, "--env", "Acrobot-v1", "--hosts", "gpu-01.example,rl@cpu-01.example,cpu-02")
    path.write_text(hosted.stdout)
    spec = load_job(path)
    assert [(h.name, h.address, h.learner, h.collectors) for h in spec.hosts] == [
        ("gpu-01", "gpu-01.example", True, 0), ("cpu-01", "rl@cpu-01.example", False, 2), ("cpu-02", "cpu-02", False, 2)]
    assert spec.env.id == "Acrobot-v1"


def test_init_refuses_bad_arguments_with_exit_2():
    for args, said in ((["--algo", "dqn"], "unknown algorithm 'dqn'"), (["--env", "Nope-v9"], "env.id"),
                       (["--hosts", "a,-oProxyCommand=x"], "hosts[1].address"), (["--hosts", "a,,b"], "empty host")):
        out = rlctl("init", *args)
        assert out.returncode == 2 and said in out.stderr and out.stdout == "", (args, out.stderr)


def test_elastic_rendezvous_numbers_learner_nodes_in_plan_order_whatever_their_addresses(monkeypatch):
    """torch's dynamic rendezvous ranks its participants in sorted order: rlctl's descriptors sort by plan node
    first (so rank 0 is the head's while it takes part), and survive the pickling the agents share state by."""
    import pickle

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from rlctl.launch.elastic import PlannedNode, PlannedNodeGenerator, rank_nodes_in_plan_order

    head, second, third = PlannedNode("10.0.0.9", 50, 0, 0), PlannedNode("10.0.0.10", 7, 0, 1), \
        PlannedNode("10.0.0.1", 3, 0, 2)
    assert sorted([third, second, head]) == [head, second, third]
    assert sorted(pickle.loads(pickle.dumps({third: 0, head: 0, second: 0}))) == [head, second, third]
    monkeypatch.setenv("RLCTL_RANK", "1")
    monkeypatch.setattr(dynamic_rendezvous.DynamicRendezvousHandler, "_node_desc_generator", None)
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0")  # recorded: undone after the test
    level = dynamic_rendezvous.logger.level
    try:
        rank_nodes_in_plan_order()
        # Each round's membership is logged (torch's INFO lines): "... has joined round N ... as rank r ...".
        assert dynamic_rendezvous.logger.isEnabledFor(logging.INFO)
    finally:
        dynamic_rendezvous.logger.setLevel(level)
    made = dynamic_rendezvous.DynamicRendezvousHandler._node_desc_generator
    assert isinstance(made, PlannedNodeGenerator) and made.generate("10.0.0.10").node == 1
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_rank_0_of_an_elastic_world_without_the_head_learns_nothing_until_it_is_stopped(tmp_path, monkeypatch,
                                                                                         capsys):
    """A rendezvous round that formed without the head (in CI: the head's agent restarting its rank while a node
    of the second host joined alone) made a second rank 0 beside the head's, learning from scratch. Such a rank
    (torchrun's rank 0 on a plan node other than 0) makes no process group, publishes and saves nothing, and ends
    on its stop (its agent's, once the head waits to join); rank 0 on the head, or in a fixed world, learns."""
    import threading

    from rlctl.net import wire
    from rlctl.roles import learner
    from rlctl.roles.context import RoleContext

    text = REMOTE_JOB.replace('name = "cpu-box"\n', 'name = "cpu-box"\nlearner = true\n')
    path = tmp_path / "elastic.toml"
    path.write_text(text.replace("[topology]\n", "[topology]\nmin_learner_nodes = 1\n"))
    spec = load_job(path)

    def rc(rank: int, node: int, job: JobSpec = spec) -> RoleContext:
        return RoleContext("learner", rank, "cpu-box", RUN_ID, job, {}, str(tmp_path), wire.CurveKeys.generate(), {},
                           learner_node=node)
    assert learner.headless(rc(0, 1)) and not learner.headless(rc(1, 1))
    path.write_text(text)  # a fixed world
    assert not learner.headless(rc(0, 1, load_job(path)))
    assert not learner.headless(rc(0, 0))

    monkeypatch.setattr(learner, "learner_device", lambda rc: pytest.fail("a headless rank 0 went on to learn"))
    stop = StopAfter()  # not a StopFlag: that one takes over this process's SIGTERM and SIGINT
    threading.Timer(0.3, lambda: setattr(stop, "requested", True)).start()
    learner.run(rc(0, 1), stop)
    assert "without the head's learner node: learning nothing until the head joins" in capsys.readouterr().out
    assert not any(tmp_path.glob("*.pt"))


class StopAfter:
    """A role's stop flag, set by the test."""

    requested = False

    def __bool__(self) -> bool:
        return self.requested
