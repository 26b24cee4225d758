"""One stream of metrics from heartbeats -> aggregated figures, TensorBoard event files.

Fixed namespaces (as CleanRL): `charts/` (env steps, episode returns),
`losses/`, `learner/`, `replay/`, `collector/`, `eval/`, `net/`.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections import deque

from rlctl import metric_names as M
from rlctl.role_names import Role


class MetricsHub:
    """Aggregates per-process heartbeat metrics into run-level figures."""

    def __init__(self, return_window: int = 20):
        self.latest: dict[str, dict] = {}  # process name -> its last metrics
        self.step_base: dict[str, int] = {}  # env steps of a collector's earlier incarnations
        self.returns: deque[float] = deque(maxlen=return_window)
        self.lengths: deque[float] = deque(maxlen=return_window)
        self.episodes = 0
        self.new_episodes: list[float] = []  # since the last drain, for per-episode TensorBoard points
        self.learner_ranks: dict[int, dict] = {}
        self.learner_worlds: list[tuple[float, int]] = []  # (when, ranks): each size the learner group took

    def on_heartbeat(self, name: str, role: str, metrics: dict) -> None:
        """Take one process's heartbeat."""
        returns = metrics.pop(M.EPISODE_RETURNS, None) or []
        lengths = metrics.pop(M.EPISODE_LENGTHS, None) or []
        clean = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        # Merge: a final heartbeat carries only a few figures and must not erase the last rates.
        self.latest[name] = {**self.latest.get(name, {}), **clean}
        if role == Role.LEARNER:
            rank = int(metrics.get("rank", 0))
            self.learner_ranks[rank] = {**self.learner_ranks.get(rank, {}), **clean}
            if rank == 0 and isinstance(clean.get(M.WORLD), int):
                self._world(clean[M.WORLD])
        rets = [float(r) for r in returns if isinstance(r, (int, float))]
        self.returns.extend(rets)
        self.lengths.extend(float(x) for x in lengths if isinstance(x, (int, float)))
        self.episodes += len(rets)
        self.new_episodes.extend(rets)

    def _world(self, world: int) -> None:
        """Rank 0 reports a group of `world` ranks: a new size is recorded, and the ranks past it are gone."""
        if self.learner_worlds and self.learner_worlds[-1][1] == world:
            return
        self.learner_worlds.append((time.time(), world))
        for rank in [r for r in self.learner_ranks if r >= world]:
            del self.learner_ranks[rank]

    def continue_from(self, env_steps: int, episodes: int) -> None:
        """A resumed run: count on from the env steps and episodes of the segments before."""
        self.step_base["earlier segments"] = max(0, env_steps)
        self.episodes = max(0, episodes)

    def on_restart(self, name: str) -> None:
        """A process restarts: keep the env steps it already made."""
        self.step_base[name] = self.step_base.get(name, 0) + int(self.latest.get(name, {}).get("env_steps", 0))
        self.latest.pop(name, None)

    def _of(self, prefix: str) -> list[dict]:
        return [m for n, m in self.latest.items() if n.startswith(prefix)]

    def snapshot(self) -> dict:
        """Run-level figures under the fixed namespaces."""
        out: dict[str, float] = {}
        collectors = self._of("collector-")
        env_steps = sum(int(m.get("env_steps", 0)) for m in collectors) + sum(self.step_base.values())
        out[M.ENV_STEPS] = env_steps
        out[M.ENV_STEPS_PER_S] = sum(float(m.get(M.ENV_STEPS_PER_S, 0.0)) for m in collectors)
        out[M.EPISODES] = self.episodes
        if self.returns:
            out[M.EPISODE_RETURN_MEAN] = sum(self.returns) / len(self.returns)
        if self.lengths:
            out[M.EPISODE_LENGTH_MEAN] = sum(self.lengths) / len(self.lengths)
        learner = self.learner_ranks.get(0, {})
        for key, value in learner.items():
            if key.startswith(("losses/", "learner/")) and isinstance(value, (int, float)):
                out[key] = value
        shards = self._of("replay-")
        for key in (M.REPLAY_SIZE, M.REPLAY_INSERT_PER_S, M.REPLAY_SAMPLED_PER_S, M.REPLAY_INSERTED):
            vals = [float(m[key]) for m in shards if key in m]
            if vals:
                out[key] = sum(vals)
        frames = [float(m[M.REPLAY_FRAMES_PER_ITEM]) for m in shards if M.REPLAY_FRAMES_PER_ITEM in m]
        if frames:
            out[M.REPLAY_FRAMES_PER_ITEM] = max(frames)
        versions = [float(m[M.COLLECTOR_WEIGHT_VERSION]) for m in collectors if M.COLLECTOR_WEIGHT_VERSION in m]
        if versions and M.VERSION in learner:
            out[M.COLLECTOR_WEIGHT_VERSION_LAG] = float(learner[M.VERSION]) - sum(versions) / len(versions)
        waits = [float(m[M.COLLECTOR_WAIT_FRAC]) for m in collectors if M.COLLECTOR_WAIT_FRAC in m]
        if waits:
            out[M.COLLECTOR_WAIT_FRAC] = sum(waits) / len(waits)
        for key in (M.COLLECTOR_TORCH_LOADED, M.COLLECTOR_STALE_ANSWERS):  # central inference: any collector's
            vals = [int(m[key]) for m in collectors if key in m]
            if vals:
                out[key] = max(vals) if key == M.COLLECTOR_TORCH_LOADED else sum(vals)
        servers = self._of("inference-")
        for key, combine in ((M.INFERENCE_REQUESTS_PER_S, sum), (M.INFERENCE_LATENCY_P50, max),
                             (M.INFERENCE_LATENCY_P99, max), (M.INFERENCE_UNDELIVERABLE, sum),
                             (M.INFERENCE_SESSIONS_BEGUN, sum)):
            vals = [float(m[key]) for m in servers if key in m]
            if vals:
                out[key] = combine(vals)
        if servers and out.get(M.INFERENCE_REQUESTS_PER_S):  # requests per forward over all servers
            forwards = sum(float(m.get(M.INFERENCE_REQUESTS_PER_S, 0)) / float(m[M.INFERENCE_BATCH_SIZE_MEAN])
                           for m in servers if m.get(M.INFERENCE_BATCH_SIZE_MEAN))
            out[M.INFERENCE_BATCH_SIZE_MEAN] = out[M.INFERENCE_REQUESTS_PER_S] / forwards if forwards else 0.0
        evaluator = self._of("evaluator-")
        for key in (M.EVAL_RETURN_MEAN, M.EVAL_LENGTH_MEAN, M.EVAL_VERSION, M.EVAL_STREAK):
            vals = [float(m[key]) for m in evaluator if key in m]
            if vals:
                out[key] = vals[0]
        out[M.NET_DROPPED] = sum(int(m.get(M.NET_DROPPED, 0)) for m in self.latest.values())
        out[M.NET_REFUSED] = sum(int(m.get(M.NET_REFUSED, 0)) for m in self.latest.values())
        return out

    def drain_episodes(self) -> list[float]:
        """Episode returns that arrived since the last call."""
        eps, self.new_episodes = self.new_episodes, []
        return eps


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli polynomial, reflected
        table.append(c)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of `data` (bytewise; event records are a few KB a second)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C."""
    x = crc32c(data)
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class TensorBoardWriter:
    """Scalars and text into a TensorBoard event file, without importing torch or tensorboard's writer.

    The records are written here (TFRecord framing: length, masked CRC-32C of the length, the Event proto, its
    masked CRC-32C) with tensorboard's protobuf classes only: its EventFileWriter imports a TensorFlow stub (and
    boto3) worth 0.3 s of CPU, which the supervisor would spend while its processes import torch.
    """

    _files = 0

    def __init__(self, logdir: str, after_step: int = -1):
        from tensorboard.compat.proto.event_pb2 import Event

        os.makedirs(logdir, exist_ok=True)
        TensorBoardWriter._files += 1
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{self._files}"
        self._file = open(os.path.join(logdir, name), "wb")
        self.after_step = after_step  # a resumed run's points start past the last step of the segments before
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write(self, event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + data
                         + struct.pack("<I", masked_crc32c(data)))

    def scalars(self, values: dict[str, float], step: int, wall: float | None = None) -> None:
        """One event holding every scalar at `step` (none at or before `after_step`)."""
        if step <= self.after_step:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()])
        self._write(Event(summary=summary, step=int(step), wall_time=wall or time.time()))

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        """A text summary (shown in TensorBoard's Text tab)."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[markdown.encode()],  # 7 = DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        summary = Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)])
        self._write(Event(summary=summary, step=step, wall_time=time.time()))

    def _plugin_event(self, tag: str, plugin: str, content: bytes, step: int = 0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=plugin, content=content))
        self._write(Event(summary=Summary(value=[Summary.Value(tag=tag, metadata=meta)]), step=step,
                          wall_time=time.time()))

    def hparams_start(self, hparams: dict[str, object], metrics: list[str], started_at: float,
                      columns: list[str] | None = None) -> None:
        """An HParams entry (TensorBoard's HParams tab): the experiment (these hyperparameters, or only `columns`,
        marked as differing between runs; these scalar tags as its metrics, whose last values are the run's final
        figures) and this run's session with its values."""
        from google.protobuf import struct_pb2
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        values = {k: (json.dumps(v) if isinstance(v, (list, tuple)) else v) for k, v in hparams.items()
                  if isinstance(v, (bool, int, float, str, list, tuple))}
        kinds = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
        experiment = api_pb2.Experiment(
            time_created_secs=started_at,
            hparam_infos=[api_pb2.HParamInfo(name=k, type=kinds.get(type(v), api_pb2.DATA_TYPE_FLOAT64),
                                             differs=columns is not None)
                          for k, v in values.items() if columns is None or k in columns],
            metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metrics])
        start = plugin_data_pb2.SessionStartInfo(start_time_secs=started_at)
        for k, v in values.items():
            if isinstance(v, bool):
                start.hparams[k].CopyFrom(struct_pb2.Value(bool_value=v))
            elif isinstance(v, str):
                start.hparams[k].CopyFrom(struct_pb2.Value(string_value=v))
            else:  # the hparams protos hold every number as a double (no integer type); the text table keeps ints
                start.hparams[k].CopyFrom(struct_pb2.Value(number_value=float(v)))
        for tag, data in (("_hparams_/experiment", plugin_data_pb2.HParamsPluginData(experiment=experiment)),
                          ("_hparams_/session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=start))):
            self._plugin_event(tag, "hparams", data.SerializeToString())

    def hparams_end(self, success: bool, ended_at: float) -> None:
        """Close this run's HParams session (succeeded: finished or stopped; else failed)."""
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS if success else api_pb2.STATUS_FAILURE,
                                             end_time_secs=ended_at)
        self._plugin_event("_hparams_/session_end_info", "hparams",
                           plugin_data_pb2.HParamsPluginData(session_end_info=end).SerializeToString())

    def flush(self) -> None:
        """Write buffered events to disk."""
        self._file.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._file.close()


def last_step(logdir: str) -> int:
    """The largest step of any event in the event files under `logdir` (-1 if none); a torn last record (a kill
    mid-write) ends a file's reading."""
    from tensorboard.compat.proto.event_pb2 import Event

    best = -1
    for root, _, files in os.walk(logdir):
        for name in files:
            if not name.startswith("events.out.tfevents."):
                continue
            try:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            at = 0
            while at + 12 <= len(data):
                (length,) = struct.unpack_from("<Q", data, at)
                end = at + 12 + length + 4
                if end > len(data):
                    break
                event = Event()
                try:
                    event.ParseFromString(data[at + 12:end - 4])
                except Exception:  # a corrupt record: what follows cannot be trusted either
                    break
                best = max(best, int(event.step))
                at = end
    return best


def hyperparameter_table(flat: dict[str, object]) -> str:
    """Markdown table of the job's settings, as CleanRL writes its hyperparameters."""
    rows = "\n".join(f"|{k}|{v}|" for k, v in sorted(flat.items()))
    return "|param|value|\n|-|-|\n" + rows


def flatten(data: dict, prefix: str = "") -> dict[str, object]:
    """Nested dict -> {"a.b": value}."""
    out: dict[str, object] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
