"""Stacked-frame experience stored once per frame (as DQN Zoo and Dopamine do), for Ape-X on Atari-style images.

An observation of the `atari` preset is a stack of the last S frames, (S, H, W) uint8, and consecutive observations
of one env share S - 1 of them. Sending and storing every transition's obs and next_obs stacks would cost 2 x S
frames; here each frame is sent and stored once:

* on the collector, `frame_table` lays out the unique frames of a chunk of vector steps, env by env, so that every
  observation of the chunk is S consecutive frames of that table (a new chain starts wherever the stack did not
  shift by one frame: a chunk's first row, an episode's reset). A transition then travels as two ints (the first
  frame of its obs stack and of its next_obs stack) beside the chunk's frames; which frames are shared is decided
  by comparing bytes, so no wrapper's padding rule is assumed.
* in the replay shard, `FrameReplay` keeps the frames in a ring of its own and each transition's two stack starts as
  global frame ids; `sample` rebuilds the stacks by index. Transitions and frames are both FIFO and a transition's
  stack starts only grow with its key, so once the frame ring overwrites a frame, the transitions that read it are
  a prefix of the keys: they are dropped from sampling (priority 0), never served with another run's pixels.

Messages stay self-contained (no frame refers to an earlier message), so ZeroMQ may spread them over any shards.

Rollouts (PPO, APPO, IMPALA) travel the same way: `rollout_frames` turns a rollout's [T+1, envs, S, H, W] `obs` into
its `frames` and [T+1, envs] `obs_frame` stack starts (a 32-step rollout of 4-frame stacks sends 3.7 times fewer
bytes, each of them encrypted and decrypted once), `parse_rollout_frames` checks what arrives, and
`rebuild_stacks` gathers the stacks again on the learner's device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from rlctl.data.buffers import DEFAULT_MAX_SNAPSHOT_BYTES, PrioritizedReplay, SnapshotError

__all__ = ["frame_stack_depth", "frame_table", "wire_item_layout", "FrameItems", "parse_frame_items", "FrameReplay",
           "rollout_frames", "parse_rollout_frames", "rebuild_stacks"]

STACK_FIELDS = {"obs": "obs_frame", "next_obs": "next_frame"}  # stacked field -> its stack-start field on the wire
# Frame ring slack over one frame per transition slot: each chunk re-sends its n-step carry and first stack (with
# the 128-step chunks of MIN_FRAME_CHUNK_STEPS and n = 3, about 5% more frames than transitions), and each episode
# starts with a whole stack. More slack would cost memory on every slot; with less, the oldest transitions lose
# their frames before their slot is reused.
FRAME_SLACK = 1 / 10
MIN_FRAME_CHUNK_STEPS = 128


def frame_capacity(capacity: int, s: int) -> int:
    """Frames the ring of a `capacity`-item FrameReplay holds."""
    return capacity + max(s, int(capacity * FRAME_SLACK))


def frame_stack_depth(job, info) -> int:
    """S when the job's observations are the `atari` preset's (S, H, W) uint8 frame stacks with S > 1, else 0."""
    env = job.env
    s = env.atari.frame_stack if env.preset == "atari" else 0
    shape = tuple(info.obs_shape)
    if s > 1 and len(shape) == 3 and shape[0] == s and np.dtype(info.obs_dtype) == np.uint8:
        return s
    return 0


def frame_table(stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique frames of [rows, envs, S, H, W] stacks -> (frames [K, H, W], start [rows * envs]): the stack of row r,
    env e is frames[start[r * envs + e] : +S]. Frames are laid out env by env; a row whose stack is the previous
    row's shifted by one frame (byte for byte) adds only its newest frame, any other row all S."""
    rows, envs, s = stacks.shape[:3]
    frame_bytes = math.prod(stacks.shape[3:])
    flat = stacks.reshape(rows, envs, s, frame_bytes)
    shifted = np.zeros((rows, envs), dtype=bool)
    if rows > 1 and s > 1:
        # Compared 8 bytes at a time where the frame size allows (84 x 84 does), through strided views (copying the
        # two overlapping slices contiguous first cost three times the comparison).
        words = flat.view(np.uint64) if frame_bytes % 8 == 0 and flat.flags.c_contiguous else flat
        shifted[1:] = (words[1:, :, :-1] == words[:-1, :, 1:]).all(axis=(2, 3))
    adds = np.where(shifted, 1, s)  # frames each row adds to the table
    adds_env_major = adds.T.reshape(-1)
    first = np.cumsum(adds_env_major) - adds_env_major  # where each row's added frames go
    # A shifted row's stack ends with its own new frame, so it starts S - 1 frames before it; a fresh row's S
    # frames are its stack.
    start = (first - (s - 1) * shifted.T.reshape(-1)).reshape(envs, rows).T.reshape(-1)
    new = np.ones((rows, envs, s), dtype=bool)
    new[..., :-1] = ~shifted[..., None]
    frames = stacks.transpose(1, 0, 2, *range(3, stacks.ndim))[new.transpose(1, 0, 2)]
    return frames, start.astype(np.int64)


def rollout_frames(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A rollout's arrays with `obs` [rows, envs, S, H, W] replaced by its unique `frames` [K, H, W] and the
    `obs_frame` [rows, envs] int32 stack starts into them."""
    out = {k: a for k, a in arrays.items() if k != "obs"}
    obs = arrays["obs"]
    out["frames"], start = frame_table(obs)
    out["obs_frame"] = start.astype(np.int32).reshape(obs.shape[:2])
    return out


def parse_rollout_frames(frames, start, rows: int, n_envs: int, obs_shape: tuple[int, ...]) -> bool:
    """Whether a rollout's `frames` and `obs_frame` of (S, H, W) observations are exactly: [K, H, W] uint8 frames
    with S <= K <= rows * n_envs * S, and [rows, n_envs] int32 starts that each leave a whole stack within them."""
    s = int(obs_shape[0])
    return (isinstance(frames, np.ndarray) and isinstance(start, np.ndarray) and frames.dtype == np.uint8
            and frames.ndim == len(obs_shape) and frames.shape[1:] == tuple(obs_shape[1:])
            and s <= len(frames) <= rows * n_envs * s
            and start.dtype == np.int32 and start.shape == (rows, n_envs)
            and int(start.min()) >= 0 and int(start.max()) <= len(frames) - s)


def rebuild_stacks(frames, start, s: int):
    """[K, H, W] frames and [...] stack starts (torch tensors on one device) -> the [..., S, H, W] stacks (one
    gather)."""
    import torch

    index = (start.reshape(-1, 1) + torch.arange(s, device=start.device)).reshape(-1)
    return frames.index_select(0, index).reshape(*start.shape, s, *frames.shape[1:])


def wire_item_layout(layout: Mapping[str, tuple], s: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """An item layout with its stacked fields replaced by their int32 stack starts (what a frame message carries
    per item, beside its `frames`)."""
    out = {}
    for name, (shape, dt) in layout.items():
        if name in STACK_FIELDS:
            out[STACK_FIELDS[name]] = ((), np.dtype(np.int32))
        else:
            out[name] = (tuple(shape), np.dtype(dt))
    return out


class FrameItems:
    """One parsed frame message: its frames [K, H, W] and its items (stack starts into those frames)."""

    def __init__(self, frames: np.ndarray, items: dict[str, np.ndarray]):
        self.frames, self.items = frames, items


def parse_frame_items(arrays: Mapping[str, np.ndarray], layout: Mapping[str, tuple], n: int,
                      max_frames: int) -> FrameItems | None:
    """A frame message's arrays (without `priority`) as FrameItems, or None unless they are exactly: `frames`
    [K, H, W] uint8 with the layout's frame shape and S <= K <= max_frames, every wire field of `layout` with n rows, and stack starts
    that lie within the frames and never decrease (the replay's eviction relies on that order)."""
    obs_shape, _ = layout["obs"]
    s = int(obs_shape[0])
    frames = arrays.get("frames")
    wire = wire_item_layout(layout, s)
    items = {k: a for k, a in arrays.items() if k != "frames"}
    if (n < 1 or frames is None or frames.dtype != np.uint8 or frames.ndim != 3
            or frames.shape[1:] != tuple(obs_shape[1:])
            or not s <= len(frames) <= max_frames):
        return None
    if ({k: (tuple(a.shape[1:]), a.dtype) for k, a in items.items()} != wire
            or any(a.ndim == 0 or len(a) != n for a in items.values())):
        return None
    for field in STACK_FIELDS.values():
        start = items[field]
        if start.min() < 0 or start.max() > len(frames) - s:
            return None
    if (np.diff(items["obs_frame"]) < 0).any():
        return None
    return FrameItems(frames, items)


class FrameReplay:
    """Prioritized replay of stacked-frame transitions that stores each frame once and rebuilds stacks on sample.

    Items are stored as PrioritizedReplay records whose stacked fields are global frame ids (int64); frames live in
    a ring of `capacity * (1 + FRAME_SLACK)` frames. `layout`, `sample` and snapshots speak the item layout
    with whole stacks, so the learner and a resumed shard see what a plain buffer would give them.
    """

    def __init__(self, capacity: int, layout: Mapping[str, tuple], *, replay: PrioritizedReplay | None = None,
                 **replay_kwargs):
        self.layout_ = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in layout.items()}
        obs_shape, _ = self.layout_["obs"]
        self.s, self.frame_shape = int(obs_shape[0]), tuple(obs_shape[1:])
        records = {STACK_FIELDS.get(k, k): (((), np.dtype(np.int64)) if k in STACK_FIELDS else v)
                   for k, v in self.layout_.items()}
        if replay is None:
            replay = PrioritizedReplay(capacity, records, **replay_kwargs)
        elif replay.layout() != records:
            raise ValueError(f"records {replay.layout()} are not this layout's frame records {records}")
        self.replay, self.capacity = replay, replay.capacity
        self.frame_capacity = frame_capacity(self.capacity, self.s)
        self.frames = np.empty((self.frame_capacity, *self.frame_shape), dtype=np.uint8)
        self.frames_written = 0
        self.valid_key = 0  # keys below this lost a frame to the ring (or were overwritten)
        self.evicted = 0  # live transitions dropped because their frames were overwritten first
        self._offsets = np.arange(self.s, dtype=np.int64)

    @property
    def size(self) -> int:
        """Transitions that can be sampled."""
        return min(self.replay.size, self.replay.inserted - self.valid_key)

    @property
    def inserted(self) -> int:
        """Transitions ever added."""
        return self.replay.inserted

    def bytes_per_item(self) -> float:
        """Memory reserved per transition slot: the records' share and the frame ring's."""
        return self.replay.bytes_per_item() + self.frames.nbytes / self.capacity

    def frames_per_item(self) -> float:
        """Frames written per transition inserted (1 + what the chunks re-send and episode starts add)."""
        return self.frames_written / max(1, self.inserted)

    def layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The item layout served (whole stacks), as the buffer was built with."""
        return dict(self.layout_)

    def add(self, batch: FrameItems, priorities: np.ndarray) -> None:
        """Append a parsed frame message's frames and items (FIFO), then drop items whose frames were overwritten."""
        frames = batch.frames
        k = len(frames)
        if k > self.frame_capacity:
            raise ValueError(f"{k} frames in one batch exceed the frame ring ({self.frame_capacity})")
        base = self.frames_written
        at = base % self.frame_capacity
        n1 = min(k, self.frame_capacity - at)
        self.frames[at:at + n1] = frames[:n1]
        self.frames[:k - n1] = frames[n1:]
        self.frames_written += k
        records = {name: (a.astype(np.int64) + base if name in STACK_FIELDS.values() else a)
                   for name, a in batch.items.items()}
        self.replay.add(records, priorities)
        self._evict()

    def _evict(self) -> None:
        """Zero the priority of the oldest items whose obs stack starts before the oldest frame still in the ring
        (a key prefix, since stack starts never decrease with the key), in blocks."""
        cutoff = self.frames_written - self.frame_capacity
        r = self.replay
        self.valid_key = max(self.valid_key, r.inserted - r.size)
        if cutoff <= 0:
            return
        block = 1024
        while self.valid_key < r.inserted:
            keys = np.arange(self.valid_key, min(self.valid_key + block, r.inserted), dtype=np.int64)
            slots = keys % r.capacity
            stale = int(np.searchsorted(r._storage["obs_frame"][slots], cutoff, side="left"))
            if stale:
                r._tree.update(slots[:stale], np.zeros(stale))
                self.evicted += stale
                self.valid_key += stale
            if stale < len(keys):
                break

    def _stacks(self, starts: np.ndarray) -> np.ndarray:
        """[n] global stack starts -> [n, S, H, W] stacks (one gather)."""
        return self.frames[(starts[:, None] + self._offsets) % self.frame_capacity]

    def _rebuild(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for name in self.layout_:
            out[name] = self._stacks(rows[STACK_FIELDS[name]]) if name in STACK_FIELDS else rows[name]
        return out

    def sample(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """As PrioritizedReplay.sample, with whole obs / next_obs stacks."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        rows, keys, weights = self.replay.sample(n)
        return self._rebuild(rows), keys, weights

    def read(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """The items of live `keys` (each in [valid_key, inserted)), stacks rebuilt: what `sample` would serve."""
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size and (keys.min() < max(self.valid_key, self.inserted - self.replay.size)
                          or keys.max() >= self.inserted):
            raise KeyError("key not live")
        rows = np.take(self.replay._records, keys % self.capacity)
        return self._rebuild({name: rows[name] for name in self.replay._storage})

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """As PrioritizedReplay.update_priorities; items that lost their frames stay out of sampling."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if keys.size != priorities.size:
            raise ValueError("keys and priorities must have the same length")
        keep = keys >= self.valid_key
        if not keep.all():
            keys, priorities = keys[keep], priorities[keep]
        return self.replay.update_priorities(keys, priorities)

    def snapshot_arrays(self) -> dict[str, np.ndarray]:
        """The records' snapshot plus the frames still in the ring and the frame counters."""
        out = self.replay.snapshot_arrays()
        held = min(self.frames_written, self.frame_capacity)
        out["frames"] = self.frames[:held].copy()
        for name, v in (("frames_written", self.frames_written), ("frame_stack", self.s),
                        ("valid_key", self.valid_key), ("evicted", self.evicted)):
            out[name] = np.array(v, dtype=np.int64)
        return out

    @classmethod
    def from_snapshot(cls, arrays: Mapping[str, np.ndarray], capacity: int | None = None, *,
                      max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES) -> FrameReplay:
        """Rebuild from `snapshot_arrays` output, validating the frame part here and the records in
        PrioritizedReplay.from_snapshot (SnapshotError if anything is off)."""
        arrays = dict(arrays)
        own = {}
        for name in ("frames", "frames_written", "frame_stack", "valid_key", "evicted"):
            if name not in arrays:
                raise SnapshotError(f"missing array {name!r} (not a frame replay snapshot)")
            own[name] = arrays.pop(name)
        scalars = {}
        for name in ("frames_written", "frame_stack", "valid_key", "evicted"):
            a = own[name]
            if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.shape not in ((), (1,)):
                raise SnapshotError(f"{name!r} must be a 0-d int64 array")
            scalars[name] = int(a.reshape(()))
            if scalars[name] < 0:
                raise SnapshotError(f"{name!r} must be >= 0, got {scalars[name]}")
        frames = own["frames"]
        if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 3:
            raise SnapshotError("'frames' must be a [K, H, W] uint8 array")
        s = scalars["frame_stack"]
        if not 1 < s <= 64:
            raise SnapshotError(f"frame_stack {s} outside (1, 64]")
        inner = PrioritizedReplay.from_snapshot(arrays, capacity, max_bytes=max_bytes)
        if frame_capacity(inner.capacity, s) * math.prod(frames.shape[1:]) > max_bytes:
            raise SnapshotError(f"the frame ring would need more than max_bytes={max_bytes}")
        stack = ((s, *frames.shape[1:]), np.dtype(np.uint8))
        fields = {name: field for field, name in STACK_FIELDS.items()}
        layout = {fields.get(k, k): (stack if k in fields else v) for k, v in inner.layout().items()}
        try:
            buf = cls(inner.capacity, layout, replay=inner)
        except (ValueError, KeyError) as e:
            raise SnapshotError(f"records are not a frame replay's: {e}") from None
        held = min(scalars["frames_written"], buf.frame_capacity)
        if len(frames) != held:
            raise SnapshotError(f"'frames' holds {len(frames)} frames, expected {held}")
        lo = max(0, scalars["frames_written"] - buf.frame_capacity)
        if scalars["valid_key"] > inner.inserted:
            raise SnapshotError(f"valid_key {scalars['valid_key']} past inserted {inner.inserted}")
        # Every item that can still be sampled must read frames the ring holds, in the order eviction relies on.
        first_live = max(scalars["valid_key"], inner.inserted - inner.size)
        slots = np.arange(first_live, inner.inserted, dtype=np.int64) % inner.capacity
        for name in STACK_FIELDS.values():
            starts = inner._storage[name][slots]
            if starts.size and (starts.min() < lo or starts.max() > scalars["frames_written"] - s):
                raise SnapshotError(f"{name} of a live item lies outside the frames held [{lo}, "
                                    f"{scalars['frames_written']})")
            if name == "obs_frame" and (np.diff(starts) < 0).any():
                raise SnapshotError("obs_frame of the live items decreases with the key")
        buf.frames[:held] = frames
        buf.frames_written, buf.valid_key, buf.evicted = (scalars["frames_written"], scalars["valid_key"],
                                                          scalars["evicted"])
        return buf
