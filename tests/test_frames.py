"""Frame-deduplicated replay (rlctl.data.frames): the stacks a FrameReplay rebuilds equal the stacks the env produced,
across episode boundaries, chunk boundaries, ring wrap-around and eviction, against the naive chunker that stores
every stack whole; snapshots and hostile messages."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq
from gymnasium.wrappers import FrameStackObservation
from hypothesis import given, settings
from conftest import examples, free_ports
from hypothesis import strategies as st

from rlctl.algos.apex.dqn import ChunkedNStep
from rlctl.data.buffers import SnapshotError, load_snapshot, save_snapshot
from rlctl.data.frames import (FRAME_SLACK, MIN_FRAME_CHUNK_STEPS, FrameReplay, frame_capacity, frame_table,
                          parse_frame_items, parse_rollout_frames, rollout_frames)
from rlctl.datapaths.rollout_source import RolloutInbox, stack_rollouts
from rlctl.net.wire import Message


class PaletteFrames(gym.Env):
    """Frames drawn from a small palette (so equal frames also meet by chance, not only by stacking), episodes of
    random length ending terminated or truncated."""

    def __init__(self, shape, palette: int, max_len: int, seed: int):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.rng = np.random.default_rng(seed)
        self.palette = self.rng.integers(0, 256, (palette, *shape), dtype=np.uint8)
        self.max_len = max_len

    def _frame(self):
        return self.palette[self.rng.integers(len(self.palette))].copy()

    def reset(self, *, seed=None, options=None):
        self.t, self.len = 0, int(self.rng.integers(1, self.max_len + 1))
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.len
        terminated = bool(end and self.rng.random() < 0.5)
        return self._frame(), float(self.rng.normal()), terminated, end and not terminated, {}


def _vec_env(shape, s, envs, palette, max_len, seed):
    return gym.vector.SyncVectorEnv(
        [lambda i=i: FrameStackObservation(PaletteFrames(shape, palette, max_len, seed + i), s) for i in range(envs)])


def _layout(s, shape):
    stack = ((s, *shape), np.dtype(np.uint8))
    return {"obs": stack, "action": ((), np.dtype(np.int64)), "reward": ((), np.dtype(np.float32)),
            "next_obs": stack, "discount": ((), np.dtype(np.float32))}


def _stream(seed, s, envs, n, chunk, shape, palette, max_len, steps):
    """Yield (naive take, frame take) pairs of two chunkers fed the same vector-env steps and Q-values."""
    rng = np.random.default_rng(seed)
    env = _vec_env(shape, s, envs, palette, max_len, seed)
    naive = ChunkedNStep(envs, n, 0.9, (s, *shape), np.uint8, chunk=chunk, n_actions=3)
    framed = ChunkedNStep(envs, n, 0.9, (s, *shape), np.uint8, chunk=chunk, n_actions=3, frame_stack=s)
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        actions = rng.integers(0, 3, envs)
        q = rng.normal(size=(envs, 3)).astype(np.float32)
        next_obs, rewards, terminated, truncated, _ = env.step(actions)
        ready = naive.add(obs, actions, rewards, next_obs, terminated, truncated, q=q)
        assert framed.add(obs, actions, rewards, next_obs, terminated, truncated, q=q) == ready
        if ready:
            yield naive.take(), framed.take()
        obs = next_obs
    env.close()


@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), s=st.integers(2, 4), envs=st.integers(1, 3), n=st.integers(1, 3),
       chunk=st.integers(2, 12), shape=st.sampled_from([(4, 4), (3, 5)]), palette=st.integers(1, 4),
       max_len=st.integers(1, 9), capacity=st.integers(8, 60))
def test_rebuilt_stacks_equal_the_envs_across_episodes_chunks_and_the_ring(seed, s, envs, n, chunk, shape, palette,
                                                                           max_len, capacity):
    layout = _layout(s, shape)
    replay = FrameReplay(capacity, layout, seed=seed)
    reference = []  # every transition, whole, in key order
    for naive, framed in _stream(seed, s, envs, n, chunk, shape, palette, max_len, steps=120):
        if not len(framed["action"]):
            assert not len(naive["action"])
            continue
        frames = framed["frames"]
        offsets = np.arange(s)
        # The message itself: every stack is S consecutive frames of the table.
        np.testing.assert_array_equal(frames[framed["obs_frame"][:, None] + offsets], naive["obs"])
        np.testing.assert_array_equal(frames[framed["next_frame"][:, None] + offsets], naive["next_obs"])
        for k in ("action", "reward", "discount", "priority"):
            np.testing.assert_array_equal(framed[k], naive[k])
        # No frame more than the chunk's rows hold (chunk + carry of n rows): at most S per row and env.
        assert len(frames) <= s * envs * (chunk + n)
        arrays = {k: v for k, v in framed.items() if k != "priority"}
        items = parse_frame_items(arrays, layout, len(framed["action"]), frame_capacity(capacity, s))
        if len(frames) > frame_capacity(capacity, s):
            assert items is None
            continue
        assert items is not None
        replay.add(items, framed["priority"])
        reference.extend({k: naive[k][i] for k in layout} for i in range(len(naive["action"])))
        del reference[:max(0, len(reference) - capacity)]
        first = replay.inserted - len(reference)
        live = np.arange(max(first, replay.valid_key), replay.inserted)
        assert replay.size == len(live)
        got = replay.read(live)
        for name in layout:
            want = np.stack([reference[k - first][name] for k in live]) if len(live) else got[name]
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        if replay.size:
            batch, keys, _ = replay.sample(16)
            assert (keys >= replay.valid_key).all() and (keys >= first).all()
            for name in layout:
                np.testing.assert_array_equal(batch[name], np.stack([reference[k - first][name] for k in keys]))


def test_a_shifted_stack_adds_one_frame_and_a_reset_stack_all_of_its_frames():
    a, b, c, d, e = (np.full((2, 2), v, np.uint8) for v in (1, 2, 3, 4, 5))
    rows = np.stack([np.stack([np.stack([a, b, c])]), np.stack([np.stack([b, c, d])]),
                     np.stack([np.stack([e, e, e])])])  # [rows=3, envs=1, S=3, 2, 2]
    frames, start = frame_table(rows)
    assert [int(f[0, 0]) for f in frames] == [1, 2, 3, 4, 5, 5, 5]
    assert start.tolist() == [0, 1, 4]


def test_frames_are_stored_about_once_per_transition():
    s, shape, envs, capacity = 4, (8, 8), 4, 4000
    replay = FrameReplay(capacity, _layout(s, shape))
    for naive, framed in _stream(3, s, envs, 3, MIN_FRAME_CHUNK_STEPS, shape, palette=200, max_len=400, steps=1500):
        arrays = {k: v for k, v in framed.items() if k != "priority"}
        replay.add(parse_frame_items(arrays, _layout(s, shape), len(framed["action"]), replay.frame_capacity),
                   framed["priority"])
    # 128-step chunks carry n - 1 + 1 rows and start with a whole stack: (128 + 3 + 3) / 128 frames per transition,
    # and each episode (200 steps on average here) starts with a whole stack.
    assert replay.frames_written / replay.inserted < 1 + FRAME_SLACK
    assert replay.evicted == 0 and replay.size == capacity


def _filled(capacity=40, s=3):
    layout = _layout(s, (4, 4))
    replay = FrameReplay(capacity, layout, seed=1)
    for _, framed in _stream(5, s, 2, 2, 6, (4, 4), 3, 5, steps=100):
        arrays = {k: v for k, v in framed.items() if k != "priority"}
        replay.add(parse_frame_items(arrays, layout, len(framed["action"]), replay.frame_capacity),
                   framed["priority"])
    return replay


def test_snapshot_round_trip_and_hostile_snapshots(tmp_path):
    replay = _filled()
    assert replay.evicted > 0  # the ring wrapped past live items: the restored one must know which
    path = save_snapshot(replay, tmp_path / "replay-0.npz")
    back = load_snapshot(path, replay.capacity, replay_class=FrameReplay)
    live = np.arange(replay.valid_key, replay.inserted)
    for name in replay.layout():
        np.testing.assert_array_equal(back.read(live)[name], replay.read(live)[name])
    assert (back.frames_written, back.valid_key, back.size) == (replay.frames_written, replay.valid_key, replay.size)

    arrays = replay.snapshot_arrays()

    def refused(**change):
        bad = {**arrays, **change}
        with pytest.raises(SnapshotError):
            FrameReplay.from_snapshot({k: v for k, v in bad.items() if v is not None}, replay.capacity)

    refused(frames=arrays["frames"][:-1])
    refused(frames=arrays["frames"].astype(np.int16))
    refused(frames_written=np.array(-1, np.int64))
    refused(frame_stack=np.array(1, np.int64))
    refused(valid_key=np.array(replay.inserted + 1, np.int64))
    refused(evicted=None)
    i = next(i for i in range(10) if f"field_{i}" in arrays and arrays[f"field_{i}"].dtype == np.int64
             and arrays[f"field_{i}"].ndim == 1 and arrays[f"field_{i}"].max() > 5)
    refused(**{f"field_{i}": arrays[f"field_{i}"][::-1].copy()})  # stack starts out of order or out of the ring
    # A plain PrioritizedReplay snapshot is not a frame replay's.
    with pytest.raises(SnapshotError):
        load_snapshot(save_snapshot(replay.replay, tmp_path / "plain.npz"), replay.capacity, replay_class=FrameReplay)


def test_hostile_frame_messages_are_refused():
    layout = _layout(3, (4, 4))
    good = {"frames": np.zeros((5, 4, 4), np.uint8), "obs_frame": np.array([0, 1], np.int32),
            "next_frame": np.array([1, 2], np.int32), "action": np.zeros(2, np.int64),
            "reward": np.zeros(2, np.float32), "discount": np.ones(2, np.float32)}
    assert parse_frame_items(good, layout, 2, 100) is not None
    for change in ({"obs_frame": np.array([0, 3], np.int32)},  # past the frames
                   {"next_frame": np.array([-1, 2], np.int32)},
                   {"obs_frame": np.array([1, 0], np.int32)},  # decreasing
                   {"obs_frame": np.array([0, 1], np.int64)},
                   {"frames": np.zeros((5, 4, 5), np.uint8)},
                   {"frames": np.zeros((2, 4, 4), np.uint8)},  # fewer than one stack
                   {"frames": np.zeros((5, 4, 4), np.float32)},
                   {"obs": np.zeros((2, 3, 4, 4), np.uint8)}):
        assert parse_frame_items({**good, **change}, layout, 2, 100) is None, change
    assert parse_frame_items(good, layout, 2, 4) is None  # more frames than the ring
    assert parse_frame_items({k: v for k, v in good.items() if k != "frames"}, layout, 2, 100) is None


def _rollouts(seed, s, envs, T, shape, palette, max_len, count):
    """`count` rollouts' observations [T+1, envs, S, *shape] as a rollout actor records them: T steps from the
    vector env (autoresetting), then the bootstrap observation; each rollout starts where the last one ended."""
    env = _vec_env(shape, s, envs, palette, max_len, seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for _ in range(count):
        rows = [obs]
        for _ in range(T):
            obs, *_ = env.step(rng.integers(0, 3, envs))
            rows.append(obs)
        yield np.stack(rows)
    env.close()


@settings(max_examples=examples(25), deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**16), s=st.integers(2, 4), envs=st.integers(1, 3), T=st.integers(1, 9),
       shape=st.sampled_from([(4, 4), (3, 5)]), palette=st.integers(1, 4), max_len=st.integers(1, 9),
       count=st.integers(1, 3))
def test_rollout_stacks_rebuilt_on_the_learner_equal_the_envs_across_episodes(seed, s, envs, T, shape, palette,
                                                                             max_len, count):
    """A rollout's obs sent as frames (rlctl.data.frames.rollout_frames) and stacked by the learner's rollout source
    (several rollouts along the env axis) are the stacks the env produced, across episode starts."""
    naive = list(_rollouts(seed, s, envs, T, shape, palette, max_len, count))
    msgs = []
    for obs in naive:
        sent = rollout_frames({"obs": obs, "reward": np.zeros((T, envs), np.float32)})
        assert sent.keys() == {"frames", "obs_frame", "reward"}
        assert parse_rollout_frames(sent["frames"], sent["obs_frame"], T + 1, envs, (s, *shape))
        # Each env's first stack whole, then one frame per step that continues an episode.
        assert envs * s <= len(sent["frames"]) <= envs * (s + T * s)
        msgs.append(Message("rollout", arrays=sent))
    got = stack_rollouts(msgs, torch.device("cpu"), frame_stack=s)
    np.testing.assert_array_equal(got["obs"].numpy(), np.concatenate(naive, axis=1))
    assert got["reward"].shape == (T, envs * count)


def test_a_continuing_rollout_sends_each_frame_once():
    """Without episode ends, a 32-step rollout of 4-frame stacks sends S + T frames per env, not (T + 1) * S."""
    (obs,) = _rollouts(3, 4, 2, 32, (4, 4), 256, 10**6, 1)
    assert len(rollout_frames({"obs": obs})["frames"]) == 2 * (4 + 32)


def test_hostile_rollout_frames_are_refused():
    """Frames or stack starts that are not exactly what a rollout of the job's layout sends are dropped, counted."""
    from rlctl.net import wire
    from rlctl.algos.onpolicy.actor import rollout_layout
    from rlctl.envs import SpaceInfo

    T, envs, s = 2, 2, 3
    info = SpaceInfo(obs_shape=(s, 4, 4), obs_dtype="uint8", n_actions=3)
    obs = np.random.default_rng(0).integers(0, 256, (T + 1, envs, s, 4, 4), dtype=np.uint8)
    arrays = {name: np.zeros((rows, envs, *shape), dtype) for name, (rows, shape, dtype)
              in rollout_layout(T, info).items()}
    good = rollout_frames({**arrays, "obs": obs})
    assert parse_rollout_frames(good["frames"], good["obs_frame"], T + 1, envs, (s, 4, 4))
    k = len(good["frames"])
    bad = [{"obs_frame": np.full((T + 1, envs), k - s + 1, np.int32)},  # a stack running past the frames
           {"obs_frame": np.full((T + 1, envs), -1, np.int32)},
           {"obs_frame": good["obs_frame"].astype(np.int64)},
           {"obs_frame": good["obs_frame"][:T]},
           {"frames": good["frames"][:, :3]},
           {"frames": good["frames"].astype(np.int16)},
           {"frames": np.zeros(((T + 1) * envs * s + 1, 4, 4), np.uint8)},  # more than the rollout can hold
           {"frames": good["frames"][:s - 1]}]
    for change in bad:
        msg = {**good, **change}
        assert not parse_rollout_frames(msg["frames"], msg["obs_frame"], T + 1, envs, (s, 4, 4)), change
    net = wire.SecureContext(wire.CurveKeys.generate())
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    inbox = RolloutInbox(net, endpoint, rollout_layout(T, info), envs, 3, frame_stack=s)
    push = net.client(zmq.PUSH, [endpoint])
    try:
        for change in [*bad, {"obs": obs}, {}]:  # whole stacks are refused too: this job sends frames
            wire.send(push, "rollout", "collector-0", 0, None, {**good, **change})
        got = []
        deadline = time.monotonic() + 10
        while len(got) + inbox.dropped < len(bad) + 2 and time.monotonic() < deadline:
            inbox.sock.poll(100)
            got += inbox.receive(100)
        assert inbox.dropped == len(bad) + 1 and len(got) == 1
    finally:
        push.close(0)
        inbox.sock.close(0)
        net.close()
