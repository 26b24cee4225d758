"""Evaluator role: greedy episodes on the newest weights; reports `eval/return_mean`.

Started as `python -m rlctl.roles.evaluator`.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.algos import build_model
from rlctl.envs import SpaceInfo, make_vec_env, probe_space_info
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main, set_torch_threads
from rlctl.net.weights import WeightSubscriber
from rlctl.checkpoint import save_checkpoint
from rlctl.job.resolved import resolved_dict
from rlctl.job.spec import EnvSpec


def greedy_episodes(model: torch.nn.Module, env_spec: EnvSpec, episodes: int, seed: int,
                    recurrent: bool = False, tick=None, video_dir: str | None = None, stochastic: bool = False,
                    progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Run `episodes` episodes at once (one sub-env each), greedy actions (`stochastic`: sampled from a policy
    network); returns (returns, lengths).

    A recurrent policy carries its state from step to step (each sub-env plays one episode, so it never resets).
    `tick()` is called every step (the evaluator's heartbeats go on through long episodes), and `progress(episodes
    done, env steps)` too. With `video_dir`, each episode is rendered (rgb_array) into `episode-<i>.mp4` there.
    """
    outer, render_mode = None, None
    if video_dir is not None:
        outer, render_mode = [_recorder(video_dir, episodes)], "rgb_array"
        quiet_offscreen_rendering()
    with warnings.catch_warnings():
        # Every recorder after the first finds the folder made and warns of overwriting; the files are its own.
        warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
        env = make_vec_env(env_spec, num_envs=episodes, outer_wrappers=outer, render_mode=render_mode)
    space = env.single_action_space
    bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    running = np.ones(episodes, dtype=bool)
    state = model.initial_state(episodes) if recurrent else None
    with torch.no_grad():
        while running.any():
            x = torch.from_numpy(np.asarray(obs))
            if recurrent:
                actions, state = model.greedy(x, state)
            else:
                actions = model.act(x)[0] if stochastic else model.greedy(x)
            actions = actions.numpy()
            if bounds is not None:
                actions = np.clip(actions, *bounds)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            if tick is not None:
                tick()
            returns += rewards * running
            lengths += running
            running &= ~(terminated | truncated)
            if progress is not None:
                progress(int(episodes - running.sum()), int(lengths.sum()))
    env.close()
    if video_dir is not None:
        for i in range(episodes):  # RecordVideo names them <prefix>-episode-<its episode number, 0>
            recorded = Path(video_dir) / f"episode-{i}-episode-0.mp4"
            if recorded.is_file():
                os.replace(recorded, Path(video_dir) / f"episode-{i}.mp4")
    return returns, lengths


def _recorder(video_dir: str, episodes: int):
    """An outer wrapper that records sub-env i's first episode, as `episode-<i>-episode-0.mp4` (gymnasium's
    RecordVideo names files itself; greedy_episodes renames them)."""
    numbers = iter(range(episodes))

    def record(env: gym.Env) -> gym.Env:
        # Only the sub-env's first episode: it plays on after its end while the others finish.
        return gym.wrappers.RecordVideo(env, video_dir, episode_trigger=lambda e: e == 0,
                                       name_prefix=f"episode-{next(numbers)}", disable_logger=True)
    return record


def quiet_offscreen_rendering() -> None:
    """Frames for videos are drawn off screen (pygame's SDL for the classic-control envs): no sound and no display
    are needed, and without these SDL probes for them and prints "XDG_RUNTIME_DIR is invalid" and ALSA's complaints
    to stderr. A user's own choice of driver stays."""
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def save_best(rc: RoleContext, model: torch.nn.Module, info: SpaceInfo, version: int, eval_return: float) -> None:
    """Keep the best-scoring weights so far as checkpoints/best.pt (what SB3's EvalCallback calls best_model)."""
    save_checkpoint(rc.checkpoint_dir, {
        "algorithm": rc.job.algorithm.name, "job": resolved_dict(rc.job), "space": info.to_dict(),
        "model": model.state_dict(), "version": version, "eval_return": eval_return,
        "time": time.time()}, name="best.pt")


class EvalRounds:
    """Rounds of greedy episodes on the model's current weights: counts them, keeps the streak at the stop target
    and reports each round's figures as a heartbeat."""

    def __init__(self, rc: RoleContext, model: torch.nn.Module, control: ControlClient, weights: WeightSubscriber):
        self.rc, self.model, self.control, self.weights = rc, model, control, weights
        self.done = 0
        self.streak = 0  # consecutive rounds at or above the stop target
        self.metrics: dict = {}

    def beat(self) -> None:
        """Heartbeats while a round plays (the supervisor takes a long silence for a hang)."""
        if self.control.due():
            self.control.heartbeat({**self.metrics, M.NET_DROPPED: self.weights.dropped})

    def play(self, version: int) -> np.ndarray:
        """One round on fresh episodes; returns the episodes' returns."""
        job = self.rc.job
        returns, lengths = greedy_episodes(self.model, job.env, job.evaluator.episodes, self.rc.seed + self.done,
                                           job.algorithm_entry.recurrent, tick=self.beat)
        self.done += 1
        target = job.job.stop.eval_return
        self.streak = self.streak + 1 if target is not None and returns.mean() >= target else 0
        self.metrics = {M.EVAL_RETURN_MEAN: float(returns.mean()), M.EVAL_RETURN_MIN: float(returns.min()),
                        M.EVAL_LENGTH_MEAN: float(lengths.mean()), M.EVAL_VERSION: version, M.EVAL_ROUNDS: self.done,
                        M.EVAL_STREAK: self.streak}
        self.rc.say(f"version {version}: return {returns.mean():.1f} (min {returns.min():.0f})")
        self.control.heartbeat({**self.metrics, M.NET_DROPPED: self.weights.dropped})
        return returns

    @property
    def confirming(self) -> bool:
        """At the stop target but not yet for `eval_rounds` rounds in a row."""
        return 0 < self.streak < self.rc.job.job.stop.eval_rounds


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Evaluate each new weight version, at most once per `evaluator.interval_s` (back to back while at the target)."""
    set_torch_threads()
    job = rc.job
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    info = probe_space_info(job.env)
    model = build_model(job, info)
    model.eval()
    weights = WeightSubscriber(net, rc.endpoints["weights"], model, rc.weight_board)
    rounds = EvalRounds(rc, model, control, weights)
    evaluated, next_at, best = 0, 0.0, float("-inf")  # evaluated: serial of the weights last evaluated
    rc.say(f"{job.evaluator.episodes} greedy episodes per round on {job.env.id}")
    while not stop:
        weights.sock.poll(100)
        weights.poll()
        now = time.monotonic()
        if weights.serial > evaluated and now >= next_at:
            version = weights.version
            returns = rounds.play(version)
            if returns.mean() >= best:
                # One lucky round does not make weights the best: one Ape-X run's best.pt, picked on a single round
                # of ten CartPole episodes, scored 451 over 100 fresh ones (16 failed). A second round on the same
                # weights (it counts towards the stop's streak like any other) scores them on twice the episodes.
                score = float(np.concatenate([returns, rounds.play(version)]).mean())
                if score >= best:  # >=: among equal scores keep the newest (most trained) weights
                    best = score
                    save_best(rc, model, info, version, best)
            # A round at the stop target is confirmed by the next ones at once (on fresh episodes): waiting
            # interval_s between them only delayed every eval_rounds stop. Once confirmed, the pace is back to
            # interval_s, so no round on weights trained past the stop replaces the figures it stopped on.
            evaluated, next_at = weights.serial, now if rounds.confirming else now + job.evaluator.interval_s
        else:
            rounds.beat()
    net.close()


if __name__ == "__main__":
    role_main(run)
