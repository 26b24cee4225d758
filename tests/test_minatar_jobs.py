"""The shipped MinAtar jobs: their envs come from rlctl's vectorized ports, and the Breakout job reaches its target."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from conftest import REPO, needs_extra, only_run, read_state, run_cli
from rlctl.envs import make_vec_env
from rlctl.minatar_vec import GAME_CLASSES
from rlctl.job.load import load_job

pytestmark = needs_extra("minatar", "minatar")

MINATAR_JOBS = sorted((REPO / "jobs").glob("*-minatar.toml"))


def test_there_is_a_shipped_job_per_game():
    games = {re.search(r"MinAtar/(\w+)-v\d", p.read_text()).group(1) for p in MINATAR_JOBS}
    assert games == {"Breakout", "Asterix", "Freeway", "SpaceInvaders", "Seaquest"}
    assert len(MINATAR_JOBS) == 5


@pytest.mark.parametrize("path", MINATAR_JOBS, ids=lambda p: p.stem)
def test_a_minatar_job_steps_the_vectorized_port_with_minatars_spaces(path):
    job = load_job(path)
    vec = make_vec_env(job.env, num_envs=3)
    ref = gym.make(job.env.id, **job.env.kwargs)  # MinAtar's own class, as evaluation and videos make it
    try:
        assert type(vec).__module__.startswith("rlctl.minatar_vec."), type(vec)
        assert vec.single_observation_space == ref.observation_space
        assert vec.single_action_space == ref.action_space
        obs, _ = vec.reset(seed=1)
        assert obs.dtype == np.bool_ and obs.shape == (3, *ref.observation_space.shape)
        assert vec.max_episode_steps == job.env.max_episode_steps and vec.sticky_action_prob == 0.0
    finally:
        vec.close()
        ref.close()


def test_sync_vectorization_keeps_minatars_own_classes():
    job = load_job(MINATAR_JOBS[0])
    env = make_vec_env(job.env.model_copy(update={"vectorization": "sync"}), num_envs=2)
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv)
    finally:
        env.close()
    assert set(GAME_CLASSES) == {"breakout", "asterix", "freeway", "space_invaders", "seaquest"}


@pytest.mark.slow
def test_the_breakout_job_reaches_its_target(tmp_path):
    """jobs/ppo-breakout-minatar.toml as shipped (its own seed, target and 600-s cap): 20-45 s here."""
    runs = tmp_path / "runs"
    job = REPO / "jobs" / "ppo-breakout-minatar.toml"
    target = load_job(job).job.stop.train_return
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=720)
    state = read_state(only_run(runs))
    assert state["status"] == "finished", state.get("exit_reason")
    by = state["stopped_by"]
    assert by["criterion"] == "train_return" and by["value"] >= target, state["exit_reason"]
    assert state["metrics"]["charts/episodes"] >= 100
