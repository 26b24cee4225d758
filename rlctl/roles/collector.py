"""The collector shell: steps a gymnasium vector env with the newest policy and pushes experience.

The shell owns the env, the weights, episode accounting, heartbeats and sending; the algorithm's `ActorCore`
(rlctl.algos) acts and decides what to record and when to cut it: n-step transitions for Ape-X, sequences for
R2D2 (both to replay shards), rollouts of one policy version for PPO, APPO and IMPALA (to one learner rank).
Started as `python -m rlctl.roles.collector` by the supervisor; everything it needs comes from the environment
(see roles/context.py).
"""

from __future__ import annotations

import os
import time

import torch

from rlctl import events
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos import build_model
from rlctl.algos.base import ActorCore, ActorSetup
from rlctl.datapaths.sender import ExperienceSender
from rlctl.envs import env_space_info, make_vec_env
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main, schedule_as_batch, set_torch_threads
from rlctl.roles.collector_report import CollectorReport, EpisodeTracker
from rlctl.net.weights import WeightSubscriber


def build_actor(rc: RoleContext, info, model: torch.nn.Module, num_envs: int) -> ActorCore:
    """The job's actor core for this collector."""
    return rc.job.algorithm_entry.load("actor")(ActorSetup(rc.job, info, model, rc.rank, num_envs, rc.seed))


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Build the env, policy, actor core and sockets, then step until stopped."""
    batch = schedule_as_batch()  # before any thread (ZeroMQ's, torch's) exists: they inherit it
    set_torch_threads()
    torch.manual_seed(rc.seed % 2**63)  # torch takes 64 bits; the role and rank are in the low ones
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(rc.job.env)
    info = env_space_info(env)
    model = build_model(rc.job, info)
    model.eval()
    # On a board's host the policy is the newest slot itself (weights change only between blocks, as it does).
    weights = WeightSubscriber(net, rc.endpoints["weights"], model, rc.weight_board, zero_copy=True,
                               bulk=rc.endpoints.get("weights_bulk"))
    actor = build_actor(rc, info, model, env.num_envs)
    sender = rc.job.data_path.senders(net, rc.endpoints, rc.job, info, rc.name, collector=rc.rank)[0]
    rc.say(f"{env.num_envs} x {rc.job.env.id} ({type(env).__name__}), {rc.job.algorithm.name}, "
           f"weights {'from shared memory ' + rc.weight_board if rc.weight_board else 'over the network'}, "
           f"pid {os.getpid()}{', SCHED_BATCH' if batch else ''} {actor.describe()}")
    try:
        with torch.no_grad():
            report = CollectorReport(control, EpisodeTracker(env.num_envs), lambda: {
                M.COLLECTOR_WEIGHT_VERSION: weights.version, M.COLLECTOR_SENT: sender.sent,
                M.NET_DROPPED: weights.dropped})
            step_loop(rc, stop, env, actor, weights, sender, report)
            control.last_metrics_line()
    finally:
        env.close()
        net.close()


def step_loop(rc: RoleContext, stop: StopFlag, env, actor: ActorCore, weights: WeightSubscriber,
              sender: ExperienceSender, report: CollectorReport) -> None:
    """Act, step, record; at each cut send the block, then take the newest weights and report.

    Weights change only between blocks (a rollout is all one version); a block the actor will not begin (PPO
    waiting for the next version, or no weights yet) waits on the weights socket, reporting meanwhile.
    """
    obs, _ = env.reset(seed=rc.seed)
    version, first = -1, True

    def waiting() -> None:
        # Blocked by a full replay shard or a busy learner: keep the weights fresh for the next block meanwhile.
        weights.poll()
        report()
    while not stop:
        weights.poll()
        report()
        if not actor.begin(weights.version, weights.serial):
            t0 = time.monotonic()
            weights.wait(50)
            report.wait_s += time.monotonic() - t0
            continue
        version = weights.version
        if first:
            # Start-up is measured up to this line (bench/solve_cartpole.py).
            events.emit("first_env_step", process=rc.name, version=int(version))
            first = False
        while True:
            actions = actor.act(obs)
            next_obs, rewards, terminated, truncated, _ = env.step(actions)
            ready = actor.record(obs, actions, rewards, next_obs, terminated, truncated)
            obs = next_obs
            if ready:
                break
        block = actor.take()
        report.env_steps += report.episodes.add(block.rewards, block.done, block.valid)
        t0 = time.monotonic()
        sent = sender.send_blocking(block.arrays, version, stop, waiting)
        report.wait_s += time.monotonic() - t0
        if not sent:
            break
        if sender.sent == block.arrays["reward"].size:  # bench/faults.py times a restart up to this line
            events.emit("first_batch_sent", process=rc.name, transitions=int(sender.sent))


if __name__ == "__main__":
    role_main(run)
