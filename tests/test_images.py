"""Image tasks: the Atari preset (ALE Pong) and MinAtar through the conv encoder, end to end with real processes.

`.ci/run` installs the `atari` and `minatar` extras these need."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, needs_extra, only_run, read_state, run_cli
from jobfiles import shipped_job
from rlctl.algos import build_model
from rlctl.envs import make_vec_env, env_space_info
from rlctl.job.env_ids import env_id_problem
from rlctl.job.load import load_job, validate_job

ATARI = needs_extra("atari", "ale_py", "cv2")
MINATAR = needs_extra("minatar", "minatar")


@ATARI
def test_atari_preset_gives_stacked_uint8_frames_and_the_nature_network():
    job = load_job(REPO / "jobs" / "appo-pong.toml")
    env = make_vec_env(job.env, num_envs=2)
    try:
        info = env_space_info(env)
        obs, _ = env.reset(seed=3)
        for _ in range(5):
            obs, *_ = env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()
    assert info.obs_shape == (4, 84, 84) and info.obs_dtype == "uint8" and info.n_actions == 6
    assert obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84) and obs.max() > 0
    model = build_model(job, info)
    conv = model.actor_body.conv
    assert [m.kernel_size for m in conv if isinstance(m, torch.nn.Conv2d)] == [(8, 8), (4, 4), (3, 3)]
    # Pixels are scaled on the network's side: the same frames as uint8 and as floats / 255 give the same output.
    x = torch.from_numpy(obs)
    assert torch.allclose(model(x)[0], model(x.float() / 255.0)[0], atol=1e-5)


def test_shared_convolutions_run_once_for_both_heads(monkeypatch):
    """One pass of the shared encoder feeds policy and value (a pass per head doubled every forward and backward);
    the heads are what each would compute from that pass."""
    from rlctl import models

    calls = []
    encode = models.ConvEncoder.forward
    monkeypatch.setattr(models.ConvEncoder, "forward", lambda self, obs: calls.append(1) or encode(self, obs))
    torch.manual_seed(0)
    model = models.ActorCritic((4, 84, 84), n_actions=6, encoder="conv")
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    head, value = model(obs)
    assert len(calls) == 1
    features = encode(model.actor_body, obs)
    assert torch.equal(head, model.actor_head(features)) and torch.equal(value, model.critic_head(features)[:, 0])


@MINATAR
def test_minatar_gets_the_small_conv_and_apex_takes_images():
    job = validate_job({"job": {"name": "m"}, "env": {"id": "MinAtar/Breakout-v1", "envs_per_collector": 2},
                        "algorithm": {"name": "apex"}, "model": {"encoder": "conv"}})
    env = make_vec_env(job.env)
    try:
        info = env_space_info(env)
        obs, _ = env.reset(seed=1)
    finally:
        env.close()
    assert info.obs_shape == (10, 10, 4) and info.obs_dtype == "bool"
    q = build_model(job, info)
    assert [m.kernel_size for m in q.conv.conv if isinstance(m, torch.nn.Conv2d)] == [(3, 3)]
    assert q(torch.from_numpy(obs)).shape == (2, 3)


def test_a_missing_env_package_is_named_with_its_extra(tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\nname = "b"\n[env]\nid = "MinAtar/Nothing-v9"\n[algorithm]\nname = "appo"\n')
    out = run_cli(["validate", str(bad)], expected_exit=2)
    assert "env.id" in out.stderr and "not registered" in out.stderr
    # A near miss is a typo while the package is installed, and a missing extra while it is not.
    assert env_id_problem("MinAtar/Breakot-v1") == "not registered in gymnasium; did you mean 'MinAtar/Breakout-v1'?"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "minatar" else real_find_spec(name, *a))
    assert env_id_problem("MinAtar/Breakot-v1") == ("not registered in gymnasium; its package is an extra: "
                                                    "pip install -e '.[minatar]'")


REGISTRY_CHILD = """
import json
import gymnasium
from rlctl.job.env_ids import register_env_packages
register_env_packages()
ours = {k: [v.entry_point, v.kwargs] for k, v in gymnasium.registry.items() if k.startswith("MinAtar/")}
for k in ours:
    del gymnasium.registry[k]
import minatar.gym
minatar.gym.register_envs()
theirs = {k: [v.entry_point, v.kwargs] for k, v in gymnasium.registry.items() if k.startswith("MinAtar/")}
print(json.dumps([ours, theirs]))
"""


@pytest.mark.slow  # imports MinAtar's display packages (2.5 s)
@MINATAR
def test_the_minatar_ids_rlctl_registers_are_the_ones_minatar_registers():
    """rlctl registers MinAtar's ids without importing the package: the same ids, entry points and kwargs as the
    installed package's own register_envs()."""
    out = subprocess.run([sys.executable, "-c", REGISTRY_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ours, theirs = json.loads(out.stdout.splitlines()[-1])
    assert len(ours) == 10 and ours == theirs, (ours, theirs)


MINATAR_ENV_CHILD = """
import sys
from rlctl.envs import make_vec_env
from rlctl.job.load import load_job
env = make_vec_env(load_job(sys.argv[1]).env, num_envs=2)
env.reset(seed=0)
print(type(env).__name__, sorted(m for m in ("minatar", "seaborn", "matplotlib") if m in sys.modules))
"""


@MINATAR
def test_a_minatar_job_s_processes_make_its_envs_without_importing_the_minatar_package():
    """MinAtar's ids are registered without importing the package, whose __init__ imports its display (seaborn,
    matplotlib: 2.6 s of every process of a MinAtar job); the vector envs are rlctl's own."""
    out = subprocess.run([sys.executable, "-c", MINATAR_ENV_CHILD, str(REPO / "jobs" / "ppo-breakout-minatar.toml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["BreakoutVec", "[]"], out.stdout


@pytest.mark.slow
@ATARI
def test_short_pong_appo_run_trains_end_to_end(tmp_path):
    """A few thousand frames of the shipped Pong job (uint8 frames from emulator to learner): updates happen, losses
    are finite, nothing is dropped on the way."""
    job = shipped_job(tmp_path, "appo-pong", stop="env_steps = 1500", wall_s=240, file_name="pong.toml",
                      collectors="1", envs_per_collector="4", batch_steps="128")
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=300)
    run_dir = only_run(runs)
    state = read_state(run_dir)
    assert state["status"] == "finished" and state["exit_reason"].startswith("charts/env_steps"), state["exit_reason"]
    m = state["metrics"]
    assert m["learner/updates"] >= 5 and np.isfinite(m["losses/policy_loss"]) and m["net/dropped"] == 0, m
    assert m["charts/env_steps"] >= 1500
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["algorithm"] == "appo"


@pytest.mark.slow
@ATARI
def test_short_pong_apex_run_stores_each_frame_once(tmp_path):
    """Ape-X on the shipped Pong job: collectors send each frame once, the shard keeps it once and rebuilds the
    stacks the learner trains on; nothing is dropped (a wrong stack layout would be)."""
    job = shipped_job(tmp_path, "apex-pong", stop="env_steps = 2000", wall_s=240, file_name="pong.toml",
                      collectors="1", envs_per_collector="4", capacity="4000", min_size="600", evaluator="false")
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=300)
    run_dir = only_run(runs)
    state = read_state(run_dir)
    assert state["status"] == "finished" and state["exit_reason"].startswith("charts/env_steps"), state["exit_reason"]
    m = state["metrics"]
    assert m["learner/updates"] >= 5 and np.isfinite(m["losses/td_loss"]) and m["net/dropped"] == 0, m
    # 128-step chunks of 4 envs: each re-sends its 3-row carry and first stacks; Pong episodes are long.
    assert 1.0 <= m["replay/frames_per_item"] < 1.1, m
    log = (run_dir / "logs" / "replay-0.log").read_text()
    kb = float(re.search(r"frames of 4-frame stacks kept once: ([\d.]+) KB per transition", log).group(1))
    assert kb < 8.0, log


@ATARI
def test_rollout_socket_buffers_scale_with_the_rollout():
    """Kernel buffers of rollout sockets: a sixteenth of a rollout, so a Pong rollout moves in large reads (4 KB ones
    woke the learner's I/O thread 4,800 times a second on the learner's core), while CartPole's stay at 4 KB and
    hold a fraction of one rollout (the bound on async policy lag)."""
    from rlctl.envs import probe_space_info
    from rlctl.datapaths.rollout_source import rollout_buffer_bytes

    pong, cartpole = load_job(REPO / "jobs" / "appo-pong.toml"), load_job(REPO / "jobs" / "appo.toml")
    big = rollout_buffer_bytes(pong, probe_space_info(pong.env))
    assert 256 << 10 <= big <= 4 << 20  # a 33 x 16 x 4 x 84 x 84 rollout: 930 KB
    assert rollout_buffer_bytes(cartpole, probe_space_info(cartpole.env)) == 4096
