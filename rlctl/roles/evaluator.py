"""Evaluator role: greedy episodes on the newest weights; reports `eval/return_mean`.

Started as `python -m rlctl.roles.evaluator`.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Callable

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
    to stderr; pygame's import would print its greeting to stdout (into `rlctl eval --json`'s output). A user's own
    choice of driver stays."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


class BestWeights:
    """Which weights are checkpoints/best.pt, the best-scoring so far (what SB3's EvalCallback calls best_model).

    One lucky round does not make weights the best. Scored on two rounds of ten CartPole episodes, the newest of the
    many weights that played 500 in both was kept, and one such Ape-X best.pt scored 464 over 100 fresh episodes
    (clean-clone CI). So new weights replace the best only if they match its score over one round more than it was
    scored on (at least two rounds, at most `max_rounds`): each new best has to hold longer. The rounds count towards
    the stop's streak like any other."""

    def __init__(self, max_rounds: int, save: Callable[[int, float, int], None]):
        self.max_rounds, self.save = max_rounds, save  # save(version, score, rounds) writes best.pt
        self.score, self.rounds = float("-inf"), 0

    def consider(self, version: int, play: Callable[[], np.ndarray], stopped: Callable[[], bool]) -> None:
        """New weights: play rounds of them (`play()`, one round's returns) while they match the best, and save them
        as the best once they have matched it over the rounds needed."""
        need = min(max(2, self.rounds + 1), self.max_rounds)
        played = [play()]
        while (score := float(np.concatenate(played).mean())) >= self.score and len(played) < need and not stopped():
            played.append(play())
        # >=: among equal scores keep the newest (most trained) weights. Weights the run stopped before their rounds
        # were played replace the best only by beating it: they are often the ones the stop was decided on.
        if score > self.score or (score == self.score and len(played) >= need):
            self.score, self.rounds = score, len(played)
            self.save(version, score, len(played))


def best_checkpoint_writer(rc: RoleContext, model: torch.nn.Module,
                           info: SpaceInfo) -> Callable[[int, float, int], None]:
    """save(version, score, rounds): the model's weights as checkpoints/best.pt."""
    def save(version: int, score: float, rounds: int) -> None:
        save_checkpoint(rc.checkpoint_dir, {
            "algorithm": rc.job.algorithm.name, "job": resolved_dict(rc.job), "space": info.to_dict(),
            "model": model.state_dict(), "version": version, "eval_return": score, "eval_rounds": rounds,
            "time": time.time()}, name="best.pt")
    return save


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
        # Sub-env i of a round is seeded `seed + i`: rounds seeded one apart shared all their episodes but one (a
        # deterministic policy on CartPole played the same nine again), so each round takes the next block of seeds.
        seed = self.rc.seed + self.done * job.evaluator.episodes
        returns, lengths = greedy_episodes(self.model, job.env, job.evaluator.episodes, seed,
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
    weights = WeightSubscriber(net, rc.endpoints["weights"], model, rc.weight_board,
                               bulk=rc.endpoints.get("weights_bulk"))
    rounds = EvalRounds(rc, model, control, weights)
    best = BestWeights(job.evaluator.best_rounds, best_checkpoint_writer(rc, model, info))
    evaluated, next_at = 0, 0.0  # evaluated: serial of the weights last evaluated
    rc.say(f"{job.evaluator.episodes} greedy episodes per round on {job.env.id}")
    while not stop:
        weights.wait(100)
        weights.poll()
        now = time.monotonic()
        if weights.serial > evaluated and now >= next_at:
            version = weights.version
            best.consider(version, lambda: rounds.play(version), lambda: bool(stop))
            # A round at the stop target is confirmed by the next ones at once (on fresh episodes): waiting
            # interval_s between them only delayed every eval_rounds stop. Once confirmed, the pace is back to
            # interval_s, so no round on weights trained past the stop replaces the figures it stopped on.
            evaluated, next_at = weights.serial, now if rounds.confirming else now + job.evaluator.interval_s
        else:
            rounds.beat()
    net.close()


if __name__ == "__main__":
    role_main(run)
