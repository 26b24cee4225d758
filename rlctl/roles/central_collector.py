"""The collector of central inference (SEED RL style): steps its vector env with actions an inference server chooses.

It loads no model, receives no weights and imports no torch (so a collector host needs none): each vector step it
sends the observations, with the rewards and episode ends of the step before, to inference server c % servers and
steps with the actions that come back. The server keeps the experience (roles/inference.py); this process counts
episodes and env steps for its heartbeats, as a local collector does. Started as `python -m
rlctl.roles.central_collector` by the supervisor (a process of its own, not forked from the torch-loaded fork server).
"""

from __future__ import annotations

import os
import secrets
import sys
import time

import numpy as np
import zmq

from rlctl import events
from rlctl import metric_names as M
from rlctl.net import wire
from rlctl.envs import SpaceInfo, env_space_info, make_vec_env
from rlctl.roles.collector_report import CollectorReport, EpisodeTracker
from rlctl.roles.context import ControlClient, RoleContext, StopFlag, role_main
from rlctl.role_names import Role

RESEND_FIRST_S, RESEND_MAX_S = 2.0, 30.0  # silence after which a request is sent again (a restarted server)


class InferenceClient:
    """DEALER to this collector's inference server: one request in flight, numbered within this process's session
    (a random token); an answer that is not the awaited one (the second answer to a request sent twice) is dropped."""

    def __init__(self, net: wire.SecureContext, endpoint: str, name: str, n_envs: int, info: SpaceInfo):
        act_shape = () if info.discrete else tuple(info.action_shape)
        act_dtype = np.dtype(np.int64) if info.discrete else np.dtype(np.float32)
        self.expected = ((n_envs, *act_shape), act_dtype)
        self.n_actions = info.n_actions if info.discrete else 0
        frame = n_envs * max(1, int(np.prod(act_shape))) * act_dtype.itemsize
        self.sock = net.client(zmq.DEALER, endpoint, sndhwm=4, rcvhwm=4, maxmsgsize=wire.CONTROL_MAXMSGSIZE + frame)
        self.name, self.token, self.seq = name, secrets.token_hex(8), 0
        self.version = -1  # weights version of the last answer
        self.dropped = self.stale = self.resends = 0
        self.round_trips: list[float] = []

    def ask(self, arrays: dict[str, np.ndarray], stop: StopFlag, on_wait) -> np.ndarray | None:
        """Send one step and wait for its actions (calling `on_wait` while waiting); None if stopped first."""
        meta = {"token": self.token, "seq": self.seq}
        wire.send(self.sock, "step", self.name, 0, meta, arrays)
        sent = last = time.monotonic()
        resend_after = RESEND_FIRST_S
        while not stop:
            if self.sock.poll(50):
                for _, msg in wire.receive_waiting(self.sock):
                    actions = self._answer(msg)
                    if actions is not None:
                        self.round_trips.append(time.monotonic() - sent)
                        self.seq += 1
                        return actions
                continue
            on_wait()
            if time.monotonic() - last >= resend_after:  # the server restarted, or the request was lost with it
                wire.send(self.sock, "step", self.name, 0, meta, arrays)
                last, resend_after = time.monotonic(), min(2 * resend_after, RESEND_MAX_S)
                self.resends += 1
        return None

    def _answer(self, msg: wire.Message | None) -> np.ndarray | None:
        """The actions if `msg` answers the request in flight; others are counted and dropped."""
        if msg is None or msg.kind != "actions" or msg.arrays.keys() != {"action"}:
            self.dropped += 1
            return None
        seq = msg.meta.get("seq")
        if seq != self.seq or isinstance(seq, bool):
            self.stale += 1
            return None
        actions = msg.arrays["action"]
        shape, dtype = self.expected
        if actions.shape != shape or actions.dtype != dtype or not _in_range(actions, self.n_actions):
            self.dropped += 1
            return None
        self.version = msg.version
        return actions

    def round_trip_ms(self) -> float:
        """Mean round trip since the last call, in ms."""
        rt, self.round_trips = self.round_trips, []
        return 1000 * sum(rt) / len(rt) if rt else 0.0


def _in_range(actions: np.ndarray, n_actions: int) -> bool:
    if n_actions:
        return bool(actions.size == 0 or (actions.min() >= 0 and actions.max() < n_actions))
    return bool(np.isfinite(actions).all())


def run(rc: RoleContext, stop: StopFlag) -> None:
    """Step the envs with the server's actions until stopped."""
    net = wire.SecureContext(rc.keys)
    control = ControlClient(net, rc)
    env = make_vec_env(rc.job.env)
    info = env_space_info(env)
    servers = rc.endpoints[Role.INFERENCE]
    server = servers[rc.rank % len(servers)]
    client = InferenceClient(net, server, rc.name, env.num_envs, info)
    episodes = EpisodeTracker(env.num_envs)
    report = CollectorReport(control, episodes, lambda: {
        M.COLLECTOR_WEIGHT_VERSION: client.version, M.COLLECTOR_INFERENCE_MS: client.round_trip_ms(),
        M.COLLECTOR_TORCH_LOADED: int("torch" in sys.modules), M.COLLECTOR_STALE_ANSWERS: client.stale,
        M.NET_DROPPED: client.dropped})
    rc.say(f"{env.num_envs} x {rc.job.env.id} ({type(env).__name__}), actions from {server} (central "
           f"inference: no model here), pid {os.getpid()}")
    try:
        step_loop(rc, stop, env, info, client, report)
    finally:
        env.close()
        net.close()


def step_loop(rc: RoleContext, stop: StopFlag, env, info: SpaceInfo, client: InferenceClient,
              report: CollectorReport) -> None:
    """Ask, step, account; the first request carries no outcome (the server starts the session with it)."""
    n = env.num_envs
    obs, _ = env.reset(seed=rc.seed)
    reward = np.zeros(n, np.float32)
    terminated, truncated, done_before = (np.zeros(n, bool) for _ in range(3))
    first = True
    while not stop:
        step = {"obs": np.asarray(obs, dtype=info.obs_dtype), "reward": reward, "terminated": terminated,
                "truncated": truncated}
        t0 = time.monotonic()
        actions = client.ask(step, stop, report)
        report.wait_s += time.monotonic() - t0
        if actions is None:
            break
        if first:  # start-up is measured up to this line (bench/solve_cartpole.py)
            events.emit("first_env_step", process=rc.name, version=int(client.version))
            first = False
        obs, rew, terminated, truncated, _ = env.step(actions)
        reward = np.array(rew, dtype=np.float32)  # a copy: the tracker keeps it until the next report
        done = terminated | truncated
        # The step after an episode's end is the env's reset (NEXT_STEP autoreset): not a transition.
        report.env_steps += report.episodes.add(reward[None], done[None], ~done_before[None])
        done_before = done
        report()


if __name__ == "__main__":
    role_main(run)
