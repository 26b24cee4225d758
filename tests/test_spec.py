"""Tests for rlctl.job.spec: loading, error reporting, TOML round trips, and fuzzing of the job schema."""

from __future__ import annotations

import copy
import datetime as dt
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from conftest import examples, run_cli

from rlctl.job import spec as spec_mod
from rlctl.job.load import JobFileError, load_job, validate_job
from rlctl.job.resolved import SECRET_MASK, host_secrets, resolved_dict, with_host_secrets
from rlctl.job.spec import JobSpec
from rlctl.job.toml_writer import dumps_toml

REPO = Path(__file__).resolve().parents[1]
JOB_FILES = sorted(p for p in (REPO / "jobs").glob("*.toml") if "[sweep]" not in p.read_text())
SWEEP_FILES = sorted(p for p in (REPO / "jobs").glob("*.toml") if "[sweep]" in p.read_text())


def rlctl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI (`python -m rlctl ARGS`) as a user would."""
    return run_cli(list(args), expected_exit=None, env={"COLUMNS": "200"}, cwd=cwd or REPO)


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL = """
[job]
name = "t"
[env]
id = "CartPole-v1"
[algorithm]
name = "apex"
"""

# A job exercising every serialization corner: escapes, nested kwargs, lists of tables, [[hosts]] with env maps.
RICH = r'''
[job]
name = "rich.job_1"
seed = 7

[job.stop]
env_steps = 100000
train_return = 195.5

[env]
id = "my_pkg.envs:make_env"
max_episode_steps = 500
vectorization = "sync"

[env.kwargs]
title = "quote \" backslash \\ tab	 newline \n cr \r bell \u0007 del \u007f unicode é ☃ 😀"
"key with spaces" = "v"
"dotted.key" = 1
sizes = [1, 2, 3]
ratios = [0.5, -2.0e-3, 1e300]
flags = [true, false]
mixed = [[1, 2], ["a", "b"], [], [{ deep = "x" }]]
empty = {}
nested = { a = { b = [1.5, -2.0], c = "x" }, "q\"k" = true }
list_of_tables = [{ x = 1 }, { y = "z", sub = { w = [] } }]

[algorithm]
name = "apex"
gamma = 0.95
lr = 2.5e-4

[model]
hidden = [256, 128, 64]
activation = "tanh"

[topology]
learner_procs = 2

[network]
base_port = 41000

[[hosts]]
name = "head"
address = "localhost"
advertise_address = "head.example"
learner = true
replay_shards = 2
evaluator = true
env = { CUDA_VISIBLE_DEVICES = "0,1", WEIRD = "a b \"c\" $HOME\n", _under_score9 = "ok" }

[[hosts]]
name = "worker-1"
address = "10.0.0.5"
user = "rl"
port = 2222
identity_file = "~/.ssh/id_ed25519"
python = "/opt/venv/bin/python"
workdir = "/srv/rl work"
collectors = 4
env = {}
'''


# ---------------------------------------------------------------------------------------------- shipped jobs


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_shipped_job_loads(path):
    spec = load_job(path)
    assert isinstance(spec, JobSpec)
    assert spec.env.id
    assert spec.algorithm.name in spec_mod.ALGORITHMS


def test_shipped_jobs_exist():
    assert any(p.name == "apex.toml" for p in JOB_FILES)


def test_cli_validate_shipped_jobs():
    proc = rlctl("validate", *[str(p.relative_to(REPO)) for p in JOB_FILES + SWEEP_FILES])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    for p in JOB_FILES + SWEEP_FILES:
        assert any(str(p.relative_to(REPO)) in line and "OK" in line for line in lines), proc.stdout
    assert "Traceback" not in proc.stderr


def test_apex_values():
    spec = load_job(REPO / "jobs" / "apex.toml")
    assert spec.job.name == "apex-cartpole"
    assert spec.env.id == "CartPole-v1"
    assert spec.algorithm.name == "apex"
    assert spec.replay.capacity == 50000
    assert spec.topology.collectors == 2
    assert spec.replay.alpha == 0.6  # default filled in
    assert spec.collector_count == 2 and spec.learner_ranks == 1 and spec.replay_shard_count == 1


def test_minimal_job_gets_defaults(tmp_path):
    spec = load_job(write(tmp_path, MINIMAL))
    assert spec.model == spec_mod.ModelSpec()
    assert spec.topology.learner_procs == 1
    assert spec.hosts == []


# ---------------------------------------------------------------------------------------------- error reports


BAD_CASES = {
    # id: (TOML text, key path, reason fragment)
    "unknown-key": (MINIMAL + "[replay]\nalhpa = 0.5\n", "replay.alhpa", "did you mean 'alpha'"),
    "unknown-top-section": (MINIMAL + "[replya]\nalpha = 0.5\n", "replya", "did you mean 'replay'"),
    "unknown-algo-key": (MINIMAL + "gama = 0.9\n", "algorithm.gama", "did you mean 'gamma'"),
    "wrong-type-str-for-float": (MINIMAL + "[replay]\nalpha = \"0.5\"\n", "replay.alpha", "valid number"),
    "wrong-type-float-for-int": (MINIMAL + "[replay]\ncapacity = 10.0\n", "replay.capacity", "valid integer"),
    "wrong-type-list": (MINIMAL + "[model]\nhidden = 64\n", "model.hidden", "valid list"),
    "out-of-range": (MINIMAL + "[replay]\nalpha = 2\n", "replay.alpha", "less than or equal to 1"),
    "out-of-range-negative": (MINIMAL + "[topology]\ncollectors = -1\n", "topology.collectors", "greater than or equal"),
    "nan": (MINIMAL + "[replay]\nalpha = nan\n", "replay.alpha", "finite"),
    "inf": (MINIMAL + "[job.stop]\nwall_s = inf\n", "job.stop.wall_s", "finite"),
    "unknown-algorithm": (MINIMAL.replace('"apex"', '"sac"'), "algorithm", "unknown algorithm 'sac'"),
    "algorithm-without-name": (MINIMAL.replace('name = "apex"', "gamma = 0.9"), "algorithm", "missing key 'name'"),
    "missing-env": (MINIMAL.replace('[env]\nid = "CartPole-v1"\n', ""), "env", "required key is missing"),
    "missing-env-id": (MINIMAL.replace('id = "CartPole-v1"', "envs_per_collector = 2"), "env.id", "required"),
    "bad-job-name": (MINIMAL.replace('name = "t"', 'name = "has space"'), "job.name", "pattern"),
    "bad-literal": (MINIMAL + "[model]\nactivation = \"gelu\"\n", "model.activation", "'relu'"),
    "duplicate-hosts": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\n[[hosts]]\nname = "a"\n',
                        "hosts[1].name", "unique"),
    "collectors-with-hosts": (MINIMAL + '[topology]\ncollectors = 3\n[[hosts]]\nname = "a"\nlearner = true\n'
                              'replay_shards = 1\n', "topology.collectors", "per host"),
    "no-learner-host": (MINIMAL + '[[hosts]]\nname = "a"\nreplay_shards = 1\n', "hosts", "learner = true"),
    "no-replay-host": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\n', "hosts", "replay_shards"),
    "bad-host-key": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\nadress = "x"\n',
                     "hosts[0].adress", "did you mean 'address'"),
    "bad-host-port": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\nport = 70000\n',
                      "hosts[0].port", "less than or equal to 65535"),
    "host-env-not-str": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\nenv = { X = 1 }\n',
                         "hosts[0].env.X", "valid string"),
    "local-server-unadvertised": (MINIMAL + '[[hosts]]\nname = "a"\naddress = "localhost"\nlearner = true\n'
                                  'replay_shards = 1\n[[hosts]]\nname = "b"\ncollectors = 2\n',
                                  "hosts[0].advertise_address", "remote hosts connect"),
    "hosts-not-array": (MINIMAL + '[hosts]\nname = "a"\n', "hosts", "valid list"),
    "bad-wrapper": (MINIMAL.replace('id = "CartPole-v1"', 'id = "CartPole-v1"\nwrappers = ["no-colon"]'),
                    "env.wrappers[0].name", "pattern"),
    "wrapper-on-native-vector-env": (MINIMAL.replace('id = "CartPole-v1"', 'id = "CartPole-v1"\nwrappers = ["a:B"]\n'
                                                     'vectorization = "vector_entry_point"'),
                                     "env.wrappers", "cannot be wrapped"),
    "r2d2-period-longer-than-sequence": (MINIMAL.replace('name = "apex"', 'name = "r2d2"\nburn_in = 2\n'
                                                         'trace_length = 3\nsequence_period = 6'),
                                         "algorithm.sequence_period", "longer than a sequence"),
    # Jobs that pass the schema but could not run (issue 13).
    "batch-size-over-shard-limit": (MINIMAL + "batch_size = 65537\n", "algorithm.batch_size",
                                    "more than a replay shard serves per request (65536)"),
    "replay-min-size-over-capacity": (MINIMAL + "[replay]\ncapacity = 50000\nmin_size = 60000\n", "replay.min_size",
                                      "60000 is more than replay.capacity 50000; a shard would never serve samples"),
    "off-policy-no-collectors": (MINIMAL + "[topology]\ncollectors = 0\n", "topology.collectors",
                                 "apex needs at least one collector"),
    "off-policy-hosts-no-collectors": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\n'
                                       '[[hosts]]\nname = "b"\ncollectors = 0\n', "hosts",
                                       "apex needs at least one collector"),
    "on-policy-no-collectors": (MINIMAL.replace('"apex"', '"ppo"') + "[topology]\ncollectors = 0\n",
                                "topology.collectors", "at least one collector per rank"),
    "ports-past-65535": (MINIMAL + "[topology]\nreplay_shards = 300\n[network]\nbase_port = 65000\n",
                         "network.base_port", "run past 65535 (to 65606); set network.base_port to at most 64929"),
    "ports-past-65535-by-learner-ranks": (MINIMAL.replace('"apex"', '"ppo"') +
                                          "[topology]\nlearner_procs = 600\ncollectors = 600\n"
                                          "[network]\nbase_port = 65000\n", "network.base_port", "run past 65535"),
    "too-many-ports-for-an-automatic-base": (MINIMAL + "[topology]\nreplay_shards = 7000\n", "network.base_port",
                                             "ports 20000-32767, too few for the job's 14007 ports"),
    "on-policy-host-replay-shards": (MINIMAL.replace('"apex"', '"ppo"') + '[[hosts]]\nname = "a"\nlearner = true\n'
                                     'collectors = 2\n[[hosts]]\nname = "b"\nreplay_shards = 1\n',
                                     "hosts[1].replay_shards", "ppo learns from rollouts, not replay"),
    "env-id-unregistered": (MINIMAL.replace("CartPole-v1", "CartPol-v1"), "env.id",
                            "not registered in gymnasium; did you mean 'CartPole-v1'?"),
    "env-id-unversioned": (MINIMAL.replace("CartPole-v1", "CartPole"), "env.id", "did you mean 'CartPole-v1'?"),
    "env-id-unknown-namespace": (MINIMAL.replace("CartPole-v1", "NoSuchSuite/Pong-v5"), "env.id",
                                 "give its entry point `module:attr`"),
    "env-id-bad-entry-point": (MINIMAL.replace("CartPole-v1", "ale_py:ALE/Pong-v5"), "env.id",
                               "an entry point is `module:attr`"),
    "host-env-name-injection": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\ncollectors = 1\n'
                                'env = { "A$(touch /tmp/pwned)" = "x" }\n', "hosts[0].env",
                                "'A$(touch /tmp/pwned)' is not an environment variable name"),
    "host-address-ssh-option": (MINIMAL + '[[hosts]]\nname = "a"\nlearner = true\nreplay_shards = 1\n'
                                'collectors = 1\naddress = "-oProxyCommand=touch /tmp/pwned"\n', "hosts[0].address",
                                "must not start with '-'"),
    "toml-syntax": (MINIMAL + "[replay\nalpha = 0.5\n", "", "not valid TOML"),
    "toml-duplicate-key": (MINIMAL + "[replay]\nalpha = 0.5\nalpha = 0.6\n", "", "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_error_names_file_key_and_reason(tmp_path, case):
    text, key, fragment = BAD_CASES[case]
    path = write(tmp_path, text, f"{case}.toml")
    with pytest.raises(JobFileError) as info:
        load_job(path)
    err = info.value
    assert err.path == str(path)
    assert err.problems, "no problems listed"
    matching = [reason for k, reason in err.problems if k == key]
    assert matching, f"no problem at key {key!r}: {err.problems}"
    assert any(fragment in reason for reason in matching), err.problems
    for k, reason in err.problems:
        assert isinstance(k, str) and isinstance(reason, str) and reason.strip()
    rendered = err.render()
    assert str(path) in rendered and fragment in rendered
    if key:
        assert f"{key}: " in rendered
    assert str(err) == rendered


def test_errors_are_all_reported_at_once(tmp_path):
    path = write(tmp_path, MINIMAL + "[replay]\nalpha = 2\nbeta = \"x\"\nalhpa = 1\n")
    with pytest.raises(JobFileError) as info:
        load_job(path)
    keys = {k for k, _ in info.value.problems}
    assert {"replay.alpha", "replay.beta", "replay.alhpa"} <= keys


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(JobFileError) as info:
        load_job(path)
    assert info.value.path == str(path)
    assert "not found" in info.value.render()


def test_unreadable_files(tmp_path):
    with pytest.raises(JobFileError, match="cannot read"):
        load_job(tmp_path)  # a directory
    bad_utf8 = tmp_path / "latin1.toml"
    bad_utf8.write_bytes(b'[job]\nname = "caf\xe9"\n')
    with pytest.raises(JobFileError, match="cannot read"):
        load_job(bad_utf8)


def test_validate_job_default_path_and_custom_path():
    with pytest.raises(JobFileError) as info:
        validate_job({"job": {"name": "x"}})
    assert info.value.path == "<job>"
    with pytest.raises(JobFileError) as info:
        validate_job({}, "somewhere.toml")
    assert info.value.render().startswith("somewhere.toml:")
    assert {k for k, _ in info.value.problems} >= {"job", "env", "algorithm"}


@pytest.mark.parametrize("case", ["unknown-key", "nan", "duplicate-hosts", "toml-syntax", "unknown-algorithm",
                                  "replay-min-size-over-capacity", "env-id-unregistered", "host-address-ssh-option"])
def test_cli_validate_bad_file_exits_2_without_traceback(tmp_path, case):
    text, key, fragment = BAD_CASES[case]
    path = write(tmp_path, text, "bad.toml")
    proc = rlctl("validate", str(path))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert str(path) in proc.stderr
    assert fragment in proc.stderr
    if key:
        assert key in proc.stderr


def test_cli_validate_mixed_files(tmp_path):
    good = write(tmp_path, MINIMAL, "good.toml")
    bad = write(tmp_path, MINIMAL + "[replay]\nalpha = 2\n", "bad.toml")
    missing = tmp_path / "missing.toml"
    proc = rlctl("validate", str(good), str(bad), str(missing))
    assert proc.returncode == 2
    assert f"{good}: OK" in proc.stdout
    assert str(bad) in proc.stderr and "replay.alpha" in proc.stderr
    assert str(missing) in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr


ENTRY_POINTS_MODULE = """
import gymnasium as gym

NOT_CALLABLE = 3


class Env(gym.Env):
    pass


class Wrap(gym.Wrapper):
    pass
"""


def test_cli_validate_loads_the_entry_points_a_job_names(tmp_path):
    # The schema checks an entry point's form only; `validate` imports it, as the env's processes would.
    (tmp_path / "myenvs.py").write_text(ENTRY_POINTS_MODULE)
    unimportable = write(tmp_path, MINIMAL.replace("CartPole-v1", "mypkg.envs:MyEnv"), "unimportable.toml")
    wrappers = write(tmp_path, MINIMAL.replace('id = "CartPole-v1"', 'id = "CartPole-v1"\nwrappers = ["myenvs:Nope", '
                                              '"myenvs:NOT_CALLABLE", { name = "nomodule:W" }]'), "wrappers.toml")
    good = write(tmp_path, MINIMAL.replace("CartPole-v1", "myenvs:Env").replace("[algorithm]", 'wrappers = '
                                          '["myenvs:Wrap", "rlctl.envs:MaskVelocity"]\n[algorithm]'), "good.toml")
    proc = rlctl("validate", str(unimportable), str(wrappers), str(good), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{good}: OK (apex, myenvs:Env)" in proc.stdout
    lines = proc.stderr.splitlines()
    assert lines[:2] == [f"{unimportable}: invalid job file", "  env.id: 'mypkg.envs:MyEnv': cannot import module "
                         "'mypkg.envs' (ModuleNotFoundError: No module named 'mypkg')"], proc.stderr
    assert lines[2:] == [f"{wrappers}: invalid job file",
                         "  env.wrappers[0]: 'myenvs:Nope': module 'myenvs' has no attribute 'Nope'",
                         "  env.wrappers[1]: 'myenvs:NOT_CALLABLE': 'NOT_CALLABLE' is a int, not a class or function",
                         "  env.wrappers[2]: 'nomodule:W': cannot import module 'nomodule' (ModuleNotFoundError: No "
                         "module named 'nomodule')"], proc.stderr
    # `run` of a job that runs on this machine checks the same before anything starts: no run directory.
    run = rlctl("run", str(unimportable), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.splitlines() == lines[:2], (run.stdout, run.stderr)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_validate_reads_the_job_from_stdin(tmp_path):
    def validate(text: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlctl", "validate", "-"], input=text, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    good = validate(MINIMAL)
    assert good.returncode == 0 and good.stdout == "<stdin>: OK (apex, CartPole-v1)\n", (good.stdout, good.stderr)
    bad = validate(MINIMAL + "[replay]\nalpha = 2\n")
    assert bad.returncode == 2 and bad.stderr.startswith("<stdin>: invalid job file\n  replay.alpha: "), bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", ["run", "plan"])
def test_cli_refuses_unrunnable_job_before_starting_anything(tmp_path, command):
    # On-policy [[hosts]] with replay shards used to end `rlctl run`/`plan` in a StopIteration traceback.
    text, key, fragment = BAD_CASES["on-policy-host-replay-shards"]
    path = write(tmp_path, text, "bad.toml")
    runs = tmp_path / "runs"
    proc = rlctl(command, str(path), "--runs-dir", str(runs))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert str(path) in proc.stderr and f"{key}: " in proc.stderr and fragment in proc.stderr
    assert not runs.exists() or not any(runs.iterdir())


def _job(**sections) -> dict:
    data = tomllib.loads(MINIMAL)
    for section, values in sections.items():
        data.setdefault(section, {}).update(values) if isinstance(values, dict) else data.__setitem__(section, values)
    return data


def _problems(data: dict) -> dict[str, str]:
    with pytest.raises(JobFileError) as info:
        validate_job(data, "job.toml")
    return dict(info.value.problems)


def test_batch_size_limit_is_the_replay_shards():
    from rlctl.datapaths.replay import MAX_SAMPLE

    assert validate_job(_job(algorithm={"name": "apex", "batch_size": MAX_SAMPLE})).algorithm.batch_size == MAX_SAMPLE
    assert "algorithm.batch_size" in _problems(_job(algorithm={"name": "apex", "batch_size": MAX_SAMPLE + 1}))


def test_a_shared_trunk_is_for_actor_critics_only():
    assert validate_job(_job(algorithm={"name": "ppo"}, model={"share_trunk": True})).model.share_trunk
    for name in ("apex", "r2d2"):
        assert "Q-network" in _problems(_job(algorithm={"name": name}, model={"share_trunk": True}))["model.share_trunk"]


def test_replay_min_size_may_equal_capacity():
    assert validate_job(_job(replay={"capacity": 5000, "min_size": 5000})).replay.min_size == 5000


@pytest.mark.parametrize("variant", [
    {}, {"topology": {"learner_procs": 3}}, {"topology": {"replay_shards": 5, "collectors": 9}},
    {"algorithm": {"name": "ppo"}, "topology": {"learner_procs": 4, "collectors": 4}},
    {"algorithm": {"name": "impala"}, "hosts": [{"name": "a", "learner": True, "learner_procs": 2, "collectors": 2},
                                                {"name": "b", "learner": True, "collectors": 3}]},
    {"hosts": [{"name": "a", "learner": True, "replay_shards": 3, "collectors": 1},
               {"name": "b", "replay_shards": 2, "collectors": 2}]},
    {"topology": {"inference": "central"}},
    {"algorithm": {"name": "impala"}, "topology": {"inference": "central"}, "inference": {"servers_per_host": 2},
     "hosts": [{"name": "a", "learner": True, "collectors": 2}, {"name": "b", "learner": True, "collectors": 3}]},
])
def test_port_count_is_what_the_plan_binds(variant):
    from rlctl.launch.plan import make_plan

    data = _job(**variant)
    if "hosts" in variant:
        data["topology"] = {k: v for k, v in data.get("topology", {}).items() if k not in spec_mod.HOST_COUNT_KEYS}
    spec = validate_job(data)
    plan = make_plan(spec, "r", "/tmp/r", 40000)
    assert max(plan.ports()) < 40000 + spec.port_count
    # Central inference: servers_per_host on each learner host, collector c asking server c % servers.
    servers = [p for p in plan.processes if p.role == "inference"]
    assert len(servers) == spec.inference_server_count == len(plan.endpoints.get("inference", []))
    assert {p.host for p in servers} <= {h["name"] for h in plan.hosts if h["learner"]}


def test_port_range_may_end_at_65535():
    topology = {"replay_shards": 300}
    need = validate_job(_job(topology=topology)).port_count
    assert need == 607
    assert validate_job(_job(topology=topology, network={"base_port": 65536 - need})).network.base_port == 65536 - need
    problems = _problems(_job(topology=topology, network={"base_port": 65537 - need}))
    assert f"to 65536); set network.base_port to at most {65536 - need}" in problems["network.base_port"]


def test_port_range_too_large_for_any_base_says_to_run_fewer():
    problems = _problems(_job(network={"base_port": 1024}, topology={"replay_shards": 40000}))
    assert "run fewer replay shards or learner ranks" in problems["network.base_port"]


def test_on_policy_job_without_replay_shards_on_hosts_is_fine():
    spec = validate_job(_job(algorithm={"name": "appo"}, hosts=[{"name": "a", "learner": True, "collectors": 2},
                                                                {"name": "b", "replay_shards": 0, "collectors": 1}]))
    assert spec.replay_shard_count == 0 and spec.collector_count == 3


@pytest.mark.parametrize("env_id", ["CartPole-v1", "CartPole-v0", "Pendulum-v1", "MountainCarContinuous-v0",
                                    "my_pkg.envs:make_env", "pkg:Env", "_private.mod:make"])
def test_registered_and_entry_point_env_ids_are_accepted(env_id):
    # Entry points are checked for their form only: the module need not be importable here.
    assert validate_job(_job(env={"id": env_id})).env.id == env_id


@pytest.mark.parametrize("env_id", ["pkg:", ":Env", "pkg:Env-v0", "a b:c", "pkg:mod:Env", "1pkg:Env"])
def test_malformed_entry_points_are_refused(env_id):
    assert "entry point is `module:attr`" in _problems(_job(env={"id": env_id}))["env.id"]


def test_env_id_check_agrees_with_gymnasium():
    import gymnasium

    registered = sorted(gymnasium.registry)[:20]
    for env_id in registered:
        assert validate_job(_job(env={"id": env_id})).env.id == env_id
    gymnasium.register("RlctlTestOnly-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        assert validate_job(_job(env={"id": "RlctlTestOnly-v0"})).env.id == "RlctlTestOnly-v0"
    finally:
        del gymnasium.registry["RlctlTestOnly-v0"]
    assert "env.id" in _problems(_job(env={"id": "RlctlTestOnly-v0"}))


def test_loading_the_schema_imports_no_gymnasium():
    probe = ("import sys; import rlctl.job.load; "
             "print(sorted(m for m in ('gymnasium', 'torch', 'numpy', 'zmq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("name", ["A$(touch /tmp/x)", "1ABC", "A-B", "a.b", "A B", "", "A=B", "A;B", "É"])
def test_host_env_names_must_be_shell_names(name):
    host = {"name": "a", "learner": True, "replay_shards": 1, "collectors": 1, "env": {name: "x"}}
    assert "not an environment variable name" in _problems(_job(hosts=[host]))["hosts[0].env"]


@pytest.mark.parametrize("field", ["address", "advertise_address", "user"])
@pytest.mark.parametrize("value", ["-oProxyCommand=sh -c id", "-p2222", "h;id", "h&&id", "h|id", "h$(id)", "h`id`",
                                  "h'x", 'h"x', "h\\x", "h<x", "h>x", "h(x)", "h{x}", "a b", "a\tb", "a\nb", "a\x00b",
                                  "a\x7fb", "a\u2003b"])
def test_host_addresses_refuse_options_and_shell_syntax(field, value):
    host = {"name": "a", "learner": True, "replay_shards": 1, "collectors": 1, field: value}
    reason = _problems(_job(hosts=[host]))[f"hosts[0].{field}"]
    assert "must not start with '-'" in reason or "must not contain" in reason


@pytest.mark.parametrize("value", ["gpu-box", "rl@10.0.0.5", "10.0.0.5", "::1", "fe80::1%eth0", "[2001:db8::1]",
                                  "2001:db8::1", "node-1.cluster.example", "ssh://rl@host:2222", "alias_name"])
def test_host_addresses_keep_ordinary_forms(value):
    host = {"name": "a", "learner": True, "replay_shards": 1, "collectors": 1, "address": value,
            "advertise_address": value}
    spec = validate_job(_job(hosts=[host]))
    assert spec.hosts[0].destination == value and spec.hosts[0].advertise_address == value


# ---------------------------------------------------------------------------------------------- round trips


def roundtrip(spec: JobSpec) -> JobSpec:
    text = dumps_toml(resolved_dict(spec))
    return validate_job(tomllib.loads(text))


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_roundtrip_shipped_jobs(path):
    spec = load_job(path)
    assert roundtrip(spec) == spec
    # The resolved job is a fixed point of the serializer.
    text = dumps_toml(resolved_dict(spec))
    assert dumps_toml(resolved_dict(validate_job(tomllib.loads(text)))) == text


@pytest.mark.parametrize("new_job", [False, True])
def test_resume_with_until_keeps_the_real_host_secrets(tmp_path, new_job):
    """--until used to validate the masked job: the processes got `********` and secrets.json was rewritten with it."""
    from rlctl.launch.resume import job_for_resume

    spec = load_job(write(tmp_path, RICH))
    assert any(h.env for h in spec.hosts)
    old = with_host_secrets(roundtrip(spec), host_secrets(spec))  # as `--resume` reads job.toml and secrets.json
    resumed = job_for_resume(old, old if new_job else None, {"env_steps": 123_456}, "--until")
    assert resumed.job.stop.env_steps == 123_456
    assert host_secrets(resumed) == host_secrets(spec)
    assert SECRET_MASK not in {v for h in resumed.hosts for v in h.env.values()}  # what the plan hands processes


def test_roundtrip_rich_job(tmp_path):
    spec = load_job(write(tmp_path, RICH))
    kwargs = spec.env.kwargs
    assert "\r" in kwargs["title"] and "\u0007" in kwargs["title"] and '"' in kwargs["title"]
    assert kwargs["list_of_tables"][1]["sub"] == {"w": []}
    assert spec.hosts[0].env["WEIRD"] == 'a b "c" $HOME\n'
    again = roundtrip(spec)
    # Host env values are secrets: job.toml holds them masked, the run's secrets file the values.
    assert all(set(v) == {SECRET_MASK} for h in again.hosts for v in [list(h.env.values())] if v)
    again = with_host_secrets(again, host_secrets(spec))
    assert again == spec
    assert again.env.kwargs == kwargs
    assert [h.env for h in again.hosts] == [h.env for h in spec.hosts]


def test_resolved_dict_fills_defaults_and_drops_none():
    spec = load_job(REPO / "jobs" / "apex.toml")
    data = resolved_dict(spec)
    assert data["replay"]["alpha"] == 0.6
    assert "hosts" not in data
    assert "env_steps" not in data["job"]["stop"]  # None dropped
    assert "max_episode_steps" not in data["env"]


def test_inf_and_nan_in_env_kwargs_survive_the_job_written_back_and_compare_the_same():
    # Found by test_fuzz_mutated_jobs: dumped as null, [inf] could not be written at all and a plain inf was dropped
    # from job.toml, which remote hosts and a resumed run read.
    from rlctl.launch.resume import changed_keys

    data = copy.deepcopy(BASE_JOBS[0])
    data["env"]["kwargs"] = {"bound": math.inf, "limits": [-math.inf, 1.0], "gap": math.nan}
    spec = validate_job(data, "inf.toml")
    again = validate_job(tomllib.loads(dumps_toml(resolved_dict(spec))), "job.toml")
    kwargs = again.env.kwargs
    assert kwargs["bound"] == math.inf and kwargs["limits"] == [-math.inf, 1.0] and math.isnan(kwargs["gap"])
    assert changed_keys(resolved_dict(spec), resolved_dict(again)) == []


@pytest.mark.parametrize("value", [
    "plain", "", "tab\there", "new\nline", "cr\rlf\r\n", "nul\x00", "esc\x1b[0m", "del\x7f", "\\", '"', "'''",
    "\u2028\u00e9\U0001f600", "\x08\x0c\x0b",
])
def test_dumps_toml_string_escapes(value):
    data = {"s": value, value: {"k": [value]}, "t": [{"x": value}]}
    assert tomllib.loads(dumps_toml(data)) == data


def test_dumps_toml_special_floats():
    data = {"a": math.inf, "b": -math.inf, "c": -0.0, "d": 1e-300, "e": 1.5e300, "f": 10**30}
    assert tomllib.loads(dumps_toml(data)) == data
    assert math.isnan(tomllib.loads(dumps_toml({"n": math.nan}))["n"])


def test_dumps_toml_rejects_unserializable():
    with pytest.raises(TypeError):
        dumps_toml({"x": object()})


# ---------------------------------------------------------------------------------------------- property-based


def _schema_keys() -> list[str]:
    """Every key name the schema knows (section names, field names), plus the algorithm tag."""
    seen: set[str] = set()
    todo: list[type[BaseModel]] = [JobSpec, *spec_mod.ALGORITHM_SPECS.values()]
    done: set[type] = set()
    while todo:
        model = todo.pop()
        if model in done:
            continue
        done.add(model)
        for name, field in model.model_fields.items():
            seen.add(name)
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                for inner in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        todo.append(inner)
    return sorted(seen | set(spec_mod.ALGORITHMS))


SCHEMA_KEYS = _schema_keys()
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
KEYS = st.one_of(st.sampled_from(SCHEMA_KEYS), st.sampled_from(SCHEMA_KEYS).map(lambda k: k + "x"), TEXT)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=70000),
    FLOATS,
    TEXT,
    st.sampled_from(["apex", "CartPole-v1", "auto", "relu", "mlp", "local", "cpu", "localhost", "10.0.0.5"]),
)
TOML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=16,
)
# TOML also has dates and times; tomllib returns them as datetime objects (dumps_toml does not write them).
DATES = st.one_of(st.dates(), st.times(), st.datetimes(), st.datetimes(timezones=st.just(dt.timezone.utc)))
ANY_VALUES = st.one_of(TOML_VALUES, DATES)


def assert_spec_or_job_error(data) -> JobSpec | None:
    """validate_job must return a JobSpec or raise JobFileError with non-empty reasons; nothing else."""
    try:
        spec = validate_job(data, "fuzz.toml")
    except JobFileError as exc:
        assert exc.problems
        for key, reason in exc.problems:
            assert isinstance(key, str)
            assert isinstance(reason, str) and reason.strip(), exc.problems
        assert exc.render().startswith("fuzz.toml: ")
        return None
    assert isinstance(spec, JobSpec)
    # Anything accepted can be written back out and is accepted again.
    text = dumps_toml(resolved_dict(spec))
    assert isinstance(validate_job(tomllib.loads(text)), JobSpec)
    return spec


def _has_nan(value) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


@settings(max_examples=examples(150), deadline=None)
@given(doc=st.dictionaries(KEYS, TOML_VALUES, max_size=6))
def test_fuzz_random_toml_documents(doc):
    text = dumps_toml(doc)
    parsed = tomllib.loads(text)
    if not _has_nan(doc):
        assert parsed == doc  # the writer is faithful
    assert_spec_or_job_error(parsed)


# Job-shaped documents: real section names holding dicts of real (or near) field names.
SECTION_DOCS = st.dictionaries(
    st.sampled_from(["job", "env", "algorithm", "model", "replay", "topology", "evaluator", "logging", "network"]),
    st.dictionaries(KEYS, TOML_VALUES, max_size=5),
    max_size=9,
)


@settings(max_examples=examples(100), deadline=None)
@given(doc=SECTION_DOCS, hosts=st.lists(st.dictionaries(KEYS, TOML_VALUES, max_size=5), max_size=3))
def test_fuzz_job_shaped_documents(doc, hosts):
    if hosts:
        doc = {**doc, "hosts": hosts}
    assert_spec_or_job_error(tomllib.loads(dumps_toml(doc)))


def _base_jobs() -> list[dict]:
    jobs = [tomllib.loads(p.read_text()) for p in JOB_FILES]
    jobs.append(tomllib.loads(RICH))
    jobs.append(tomllib.loads(MINIMAL))
    return jobs


BASE_JOBS = _base_jobs()


def _paths(node, prefix=()):
    """Every (container, key) location in a parsed document: dict keys and list indices."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for k, v in items:
        out.append(prefix + (k,))
        if isinstance(v, (dict, list)):
            out.extend(_paths(v, prefix + (k,)))
    return out


def _dicts(node, prefix=()):
    """Paths of every dict (table) in a document, the root included."""
    out = [prefix] if isinstance(node, dict) else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        out.extend(_dicts(v, prefix + (k,)))
    return out


def _get(node, path):
    for k in path:
        node = node[k]
    return node


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (dt.date, dt.time)):
        return "date"
    return type(value).__name__


def _mutate(data, draw) -> None:
    op = draw(st.sampled_from(["delete", "retype", "rename", "add", "deep"]))
    paths = _paths(data)
    if op in ("delete", "retype", "rename") and paths:
        path = draw(st.sampled_from(paths))
        parent = _get(data, path[:-1])
        key = path[-1]
        if op == "delete":
            del parent[key]
        elif op == "retype":
            old = _kind(parent[key])
            parent[key] = draw(ANY_VALUES.filter(lambda v: _kind(v) != old))
        elif isinstance(parent, dict):
            value = parent.pop(key)
            parent[draw(KEYS)] = value
        else:
            parent[key] = draw(ANY_VALUES)
        return
    target = _get(data, draw(st.sampled_from(_dicts(data))))
    value = draw(ANY_VALUES)
    if op == "deep":
        for key in reversed(draw(st.lists(KEYS, min_size=1, max_size=4))):
            value = {key: value}
    target[draw(KEYS)] = value


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(base=st.sampled_from(range(len(BASE_JOBS))), data=st.data())
def test_fuzz_mutated_jobs(base, data):
    doc = copy.deepcopy(BASE_JOBS[base])
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        _mutate(doc, data.draw)
    assert_spec_or_job_error(doc)


@pytest.mark.parametrize("index", range(len(BASE_JOBS)))
def test_fuzz_bases_are_valid(index):
    assert isinstance(validate_job(copy.deepcopy(BASE_JOBS[index])), JobSpec)


TOML_FRAGMENTS = st.sampled_from([
    "[job]", "[env]", "[algorithm]", "[[hosts]]", "[replay]", "[job.stop]", 'name = "apex"', 'id = "CartPole-v1"',
    "name = \"x\"", "alpha = 0.5", "alpha = nan", "= 1", "[", "]", '"', "'''", '"""', "key = ", "a.b.c = 1",
    "x = 1979-05-27T07:32:00Z", "x = [1, 'a', {b = 2}]", "learner = true", "replay_shards = 1", "\\", "\t", "#",
])
RAW_TEXT = st.one_of(
    TEXT,
    st.lists(st.one_of(TOML_FRAGMENTS, TEXT), max_size=12).map("\n".join),
    st.lists(TOML_FRAGMENTS, max_size=20).map("\n".join),
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=RAW_TEXT)
def test_fuzz_raw_text_to_load_job(tmp_path, text):
    path = tmp_path / "raw.toml"
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_job(path)
    except JobFileError as exc:
        assert exc.path == str(path)
        assert exc.problems and all(isinstance(r, str) and r.strip() for _, r in exc.problems)
        return
    assert isinstance(spec, JobSpec)


@settings(max_examples=examples(50), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64))
def test_fuzz_raw_bytes_to_load_job(tmp_path, raw):
    path = tmp_path / "raw.toml"
    path.write_bytes(raw)
    try:
        load_job(path)
    except JobFileError as exc:
        assert exc.problems and all(r.strip() for _, r in exc.problems)


def test_readme_job_reference_is_current():
    from rlctl.job.jobref import render_reference

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("<!-- job-reference:start -->\n", 1)[1].split("<!-- job-reference:end -->", 1)[0]
    assert section.strip() == render_reference().strip(), "README job reference is stale: python -m rlctl.job.jobref --write README.md"


def test_eval_stop_needs_the_configured_rounds_in_a_row():
    from rlctl.supervise.loop import StopCriteria

    job = validate_job({"job": {"name": "t", "stop": {"eval_return": 475.0, "eval_rounds": 3}},
                        "env": {"id": "CartPole-v1"}, "algorithm": {"name": "apex"}})
    criteria = StopCriteria(job, started=0.0)
    assert criteria.reached({"eval/return_mean": 500.0, "eval/streak": 2}, 0, 1.0) is None
    assert criteria.reached({"eval/return_mean": 500.0, "eval/streak": 3}, 0, 1.0) == \
        "eval/return_mean 500.0 >= 475 (3 rounds in a row)"
    assert criteria.reached({"eval/return_mean": 400.0, "eval/streak": 0}, 0, 1.0) is None
    # What state.json keeps for code ("stopped_by"): the criterion and its figures, no sentence to parse.
    assert criteria.met({"eval/return_mean": 500.0, "eval/streak": 3}, 0, 1.0).record() == \
        {"criterion": "eval_return", "value": 500.0, "threshold": 475.0}


def test_env_wrappers_short_and_table_forms_round_trip(tmp_path):
    text = MINIMAL.replace('id = "CartPole-v1"', 'id = "CartPole-v1"\nwrappers = ["rlctl.envs:MaskVelocity", '
                           '{ name = "gymnasium.wrappers:TimeAwareObservation", kwargs = { flatten = true } }]')
    spec = load_job(write(tmp_path, text))
    assert [(w.name, w.kwargs) for w in spec.env.wrappers] == [
        ("rlctl.envs:MaskVelocity", {}), ("gymnasium.wrappers:TimeAwareObservation", {"flatten": True})]
    again = validate_job(tomllib.loads(dumps_toml(resolved_dict(spec))))
    assert again == spec


def test_mask_velocity_hides_cartpole_velocities():
    import numpy as np

    from rlctl.envs import make_vec_env

    # Both sync: the native vector CartPole draws its resets differently.
    plain = validate_job({"job": {"name": "p"}, "env": {"id": "CartPole-v1", "envs_per_collector": 2,
                                                       "vectorization": "sync"},
                          "algorithm": {"name": "apex"}})
    masked = validate_job({"job": {"name": "m"}, "env": {"id": "CartPole-v1", "envs_per_collector": 2,
                                                        "wrappers": ["rlctl.envs:MaskVelocity"]},
                           "algorithm": {"name": "apex"}})
    full, hidden = make_vec_env(plain.env), make_vec_env(masked.env)
    assert hidden.single_observation_space.shape == (2,)
    o_full, _ = full.reset(seed=5)
    o_hidden, _ = hidden.reset(seed=5)
    for _ in range(5):
        np.testing.assert_allclose(o_hidden, o_full[:, [0, 2]])  # cart position and pole angle only
        actions = np.array([0, 1])
        o_full = full.step(actions)[0]
        o_hidden = hidden.step(actions)[0]
    full.close()
    hidden.close()
