"""Every registered algorithm's actor and learner cores, run in-process without torchrun or sockets ("serial mode"):
the actor core steps a real vector env and cuts experience, which (through a real PrioritizedReplay for the replay
data path, stacked as the learner's rollout source stacks it for the rollouts path) feeds the learner core."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from rlctl.net import wire
from rlctl.algos import ALGORITHMS, build_model
from rlctl.algos.base import ActorCore, ActorSetup, LearnerCore
from rlctl.data.buffers import PrioritizedReplay
from rlctl.envs import env_space_info, make_vec_env, probe_space_info
from rlctl.models import flat_parameters
from rlctl.roles.learner import build_core
from rlctl.datapaths.rollout_source import stack_rollouts
from rlctl.job.load import validate_job

SMALL = {
    "apex": {"batch_size": 16, "send_batch": 16},
    "ppo": {"rollout_len": 8, "epochs": 2, "minibatches": 2},
    "appo": {"rollout_len": 8, "rollouts_per_batch": 2, "vtrace": True},
    "impala": {"rollout_len": 8, "rollouts_per_batch": 2},
    "r2d2": {"batch_size": 4, "burn_in": 2, "trace_length": 4, "sequence_period": 3, "lstm_size": 8, "send_batch": 2},
}
ENVS = 4


def small_job(name: str):
    """A CartPole job of `name` with small batches, as the registry's spec validates it."""
    return validate_job({"job": {"name": f"core-{name}", "seed": 7},
                         "env": {"id": "CartPole-v1", "envs_per_collector": ENVS},
                         "algorithm": {"name": name, **SMALL.get(name, {})},
                         "model": {"hidden": [16]}, "topology": {"collectors": 2}})


def collect_blocks(job, count: int):
    """Run the job's actor core against a real vector env until it has cut `count` blocks."""
    env = make_vec_env(job.env)
    info = env_space_info(env)
    model = build_model(job, info)
    actor = job.algorithm_entry.load("actor")(ActorSetup(job, info, model, rank=0, num_envs=env.num_envs, seed=1))
    obs, _ = env.reset(seed=1)
    blocks, version, steps = [], 0, 0
    with torch.no_grad():
        while len(blocks) < count:
            assert actor.begin(version, version + 1), "a fresh version must start a block"
            while True:
                actions = actor.act(obs)
                next_obs, rewards, terminated, truncated, _ = env.step(actions)
                steps += 1
                assert steps < 20_000, "the actor never cut a block"
                ready = actor.record(obs, actions, rewards, next_obs, terminated, truncated)
                obs = next_obs
                if ready:
                    break
            block = actor.take()
            assert block.rewards.shape == block.done.shape == block.valid.shape
            assert block.rewards.shape[1] == env.num_envs
            blocks.append(block)
            version += 1  # a new version each block, as a learner publishing after every update would
    env.close()
    return info, model, actor, blocks


def learner_batch(job, blocks):
    """A learner batch from the actor's blocks: sampled from a real PrioritizedReplay (replay data path, with the
    actor's initial priorities), or two rollouts stacked as the learner's rollout source stacks them."""
    if job.algorithm_entry.data_path.shard_role:
        items = [b.arrays for b in blocks]
        fields = {k: (v.shape[1:], v.dtype) for k, v in items[0].items() if k != "priority"}
        replay = PrioritizedReplay(1000, fields, seed=0)
        for item in items:
            prio = item["priority"]
            assert prio.shape == (len(item["action"]),) and np.isfinite(prio).all() and (prio >= 0).all()
            replay.add({k: v for k, v in item.items() if k != "priority"}, prio)
        batch, keys, weights = replay.sample(job.algorithm.batch_size)
        return {**batch, "keys": keys, "weights": weights}
    msgs = [wire.Message("rollout", arrays=b.arrays) for b in blocks[:2]]
    return stack_rollouts(msgs, torch.device("cpu"))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_actor_core_feeds_learner_core_in_process(name):
    torch.manual_seed(0)
    job = small_job(name)
    info, _, actor, blocks = collect_blocks(job, 6)
    core = build_core(job, info, torch.device("cpu"))
    before = flat_parameters(core.model).clone()
    result = core.update(learner_batch(job, blocks))
    if job.algorithm_entry.data_path.shard_role:
        assert result.priorities is not None and result.priorities.shape == (job.algorithm.batch_size,)
        assert np.isfinite(result.priorities).all()
    assert result.samples > 0
    stats = {k: float(v) for k, v in result.stats.items()}
    assert stats and all(np.isfinite(v) for v in stats.values()), stats
    assert not torch.equal(before, flat_parameters(core.model)), "an update must change the parameters"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_learner_core_state_restores_the_same_next_update(name):
    """Model plus the core's state_dict (what a checkpoint keeps) restore a core that takes the very same next
    update: optimizer moments, target network and counters all come back."""
    torch.manual_seed(0)
    job = small_job(name)
    info, _, _, blocks = collect_blocks(job, 6)
    batch = learner_batch(job, blocks)
    core = build_core(job, info, torch.device("cpu"))
    core.update(batch)
    saved_model, saved_core = copy.deepcopy(core.model.state_dict()), copy.deepcopy(core.state_dict())
    torch.manual_seed(99)  # a differently initialised twin
    twin = build_core(job, info, torch.device("cpu"))
    twin.model.load_state_dict(saved_model)
    twin.load_state_dict(saved_core)
    core.update(batch)
    twin.update(batch)
    assert torch.equal(flat_parameters(core.model), flat_parameters(twin.model))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_meets_the_declared_core_contract(name):
    """What the shells read of an algorithm's parts is declared in rlctl.algos.base and rlctl.datapaths; every
    registered algorithm provides it: the learner core computes losses and leaves the gradient step (and the
    update loop) to the base class; the actor core acts in three parts and declares its data path's message layout;
    the model acts greedily for the evaluator."""
    job = small_job(name)
    entry = job.algorithm_entry
    learner, actor = entry.load("learner"), entry.load("actor")
    assert issubclass(learner, LearnerCore) and issubclass(actor, ActorCore)
    for shell_owned in ("update", "gradient_step"):
        assert getattr(learner, shell_owned) is getattr(LearnerCore, shell_owned), f"{name} overrides {shell_owned}"
    for method in ("loss", "samples"):
        assert getattr(learner, method) is not getattr(LearnerCore, method), f"{name}'s core lacks {method}"
    for method in ("forward", "act_on", "record", "take"):
        assert getattr(actor, method) is not getattr(ActorCore, method), f"{name}'s actor lacks {method}"
    info = probe_space_info(job.env)
    entry.data_path.check_actor(entry, actor, job, info)
    core = build_core(job, info, torch.device("cpu"))
    assert isinstance(core.model, torch.nn.Module) and isinstance(core.opt, torch.optim.Optimizer)
    assert 0 < core.max_grad_norm < 1e9 and core.publish_interval >= 1
    assert callable(getattr(core.model, "greedy", None)), f"{name}'s model lacks greedy (the evaluator acts by it)"


def test_an_actor_without_its_paths_layout_fields_is_refused_naming_them():
    job = small_job("ppo")

    class Bare(ActorCore):
        @staticmethod
        def layout(T, info):
            return {"obs": (T + 1, (4,), np.dtype(np.float32))}

    with pytest.raises(TypeError, match=r"Bare's layout lacks action, reward, valid, which the 'rollouts' data path"):
        job.data_path.check_actor(job.algorithm_entry, Bare, job, probe_space_info(job.env))
    with pytest.raises(TypeError, match=r"declares no message layout for the 'replay' data path"):
        small_job("apex").data_path.check_actor(job.algorithm_entry, ActorCore, job, probe_space_info(job.env))


def test_recurrent_actor_state_starts_anew_with_each_episode():
    """R2D2's actor carries each env's state across steps and zeroes it before a new episode's first step."""
    job = small_job("r2d2")
    env = make_vec_env(job.env, num_envs=2)
    info = env_space_info(env)
    model = build_model(job, info)
    actor = job.algorithm_entry.load("actor")(ActorSetup(job, info, model, rank=0, num_envs=2, seed=1))
    obs, _ = env.reset(seed=3)
    zero = model.initial_state(2)
    saw_carry = saw_reset = False
    prev_done = np.zeros(2, dtype=bool)
    reset_obs_next = np.zeros(2, dtype=bool)
    with torch.no_grad():
        for _ in range(400):
            actor.act(obs)
            h_before = actor.before[0]
            for e in range(2):
                if reset_obs_next[e]:
                    assert torch.equal(h_before[e], zero[0][e]), "state not reset at an episode's first step"
                    saw_reset = True
                elif h_before[e].abs().sum() > 0:
                    saw_carry = True
            next_obs, rewards, terminated, truncated, _ = env.step(np.zeros(2, dtype=np.int64))
            actor.record(obs, np.zeros(2, dtype=np.int64), rewards, next_obs, terminated, truncated)
            reset_obs_next, prev_done = prev_done, terminated | truncated
            obs = next_obs
    assert saw_carry and saw_reset


def test_no_module_outside_algos_names_an_algorithm():
    """Algorithms are known by name only in rlctl/algos: the rest reads the registry entry's traits."""
    root = Path(__file__).resolve().parents[1] / "rlctl"
    names = set(ALGORITHMS)
    offenders = []
    for path in root.rglob("*.py"):
        if "algos" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                offenders.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    assert not offenders, offenders
