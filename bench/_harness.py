"""Shared helpers for the process-level benchmarks in bench/.

The benchmarks start the project's real role modules (`python -m rlctl.roles.<role>`)
as subprocesses with the environment `rlctl.launch.plan.make_plan` would give them, and
play the missing peers themselves (control ROUTER, experience PULL sink, weights
PUB, ...) with `rlctl.net.wire` and real CURVE keys.

Processes start through `children` (bench/_children.py): a bench calls `children.install()` first in main(), and
whatever it started is stopped (process groups and descendants) when it is killed (SIGTERM, SIGINT), fails or ends.

Nothing here imports torch; numpy, zmq and rlctl.net.wire only.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import zmq

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/x.py` from a checkout
    sys.path.insert(0, str(REPO))
if str(REPO / "bench") not in sys.path:
    sys.path.insert(0, str(REPO / "bench"))

import _children as children  # noqa: E402
from rlctl.net import wire  # noqa: E402
from rlctl.launch.plan import ROLE_MODULES  # noqa: E402

APEX_JOB = REPO / "jobs" / "apex.toml"


# --------------------------------------------------------------------------- job files, keys, ports

def load_toml(path: str | Path = APEX_JOB) -> dict:
    """A job file as plain data."""
    with open(path, "rb") as f:
        return tomllib.load(f)


def deep_merge(base: dict, override: dict) -> dict:
    """`base` with `override` merged in, tables recursively (new dict)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def write_job(directory: str | Path, overrides: dict | None = None, base: str | Path = APEX_JOB,
              name: str = "job.toml") -> Path:
    """Write `base` (jobs/apex.toml) with `overrides` merged in as a TOML file; validated with rlctl.job.load."""
    from rlctl.job.load import load_job
    from rlctl.job.toml_writer import dumps_toml  # pydantic: only in the bench process, never on a timed path

    data = deep_merge(load_toml(base), overrides or {})
    path = Path(directory) / name
    path.write_text(dumps_toml(data))
    load_job(path)  # raise here, not in the child, when an override is wrong
    return path


def generate_keys() -> wire.CurveKeys:
    """Fresh CURVE key pairs, as `rlctl run` makes for each job."""
    return wire.CurveKeys.generate()


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct loopback ports that were free a moment ago (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def make_endpoints(replay_shards: int = 1, host: str = "127.0.0.1") -> tuple[dict, dict]:
    """(endpoints, binds) shaped like make_plan's for an all-local job.

    endpoints: what every process gets in RLCTL_ENDPOINTS; binds: {"control", "weights",
    "replay": [{"experience", "sample"}, ...]} for whoever binds them (the bench or a role).
    """
    ports = iter(free_ports(3 + 2 * replay_shards, host))
    control, weights, rdzv = next(ports), next(ports), next(ports)
    replay = [{"experience": f"tcp://{host}:{next(ports)}", "sample": f"tcp://{host}:{next(ports)}"}
              for _ in range(replay_shards)]
    endpoints = {"control": f"tcp://{host}:{control}", "weights": f"tcp://{host}:{weights}",
                 "rendezvous": f"{host}:{rdzv}", "replay": replay}
    binds = {"control": endpoints["control"], "weights": endpoints["weights"], "replay": replay}
    return endpoints, binds


def role_env(role: str, rank: int, job_path: str | Path, endpoints: dict, keys: wire.CurveKeys,
             run_id: str, binds: dict | None = None, checkpoint_dir: str = "", extra: dict | None = None) -> dict:
    """The environment of one role process, as rlctl.launch.plan.make_plan builds it (plus the real keys)."""
    env = dict(os.environ)
    env.update({
        "RLCTL_RUN_ID": run_id,
        "RLCTL_JOB": str(job_path),
        "RLCTL_CHECKPOINT_DIR": checkpoint_dir,
        "RLCTL_ENDPOINTS": json.dumps(endpoints, sort_keys=True, separators=(",", ":")),
        "RLCTL_CURVE_KEYS": keys.to_env(),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "RLCTL_ROLE": role,
        "RLCTL_RANK": str(rank),
        "RLCTL_HOST": "localhost",
        "RLCTL_BINDS": json.dumps(binds or {}, sort_keys=True, separators=(",", ":")),
    })
    if role == "learner":  # torchrun's variables
        env.update({"RANK": str(rank), "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------- processes

class Proc:
    """One subprocess in its own process group, output to a log file; `stop()` is SIGTERM, then SIGKILL.

    Started through bench/_children.py, so it is also stopped when the bench is killed or fails."""

    def __init__(self, name: str, argv: list[str], env: dict, log_dir: str | Path, grace: float = 5.0):
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.popen = children.spawn(argv, grace=grace, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                    stderr=subprocess.STDOUT, cwd=str(REPO))

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def check(self) -> None:
        """Raise with the log tail if the process died."""
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the group, wait (for the whole group), then SIGKILL; returns the exit code."""
        children.stop([self.popen], grace=timeout)
        self._log.close()
        return self.popen.returncode


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used, from /proc (NaN if unavailable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return float("nan")


def start_role(role: str, rank: int, job_path: str | Path, endpoints: dict, keys: wire.CurveKeys, run_id: str,
               log_dir: str | Path, binds: dict | None = None, extra_env: dict | None = None) -> Proc:
    """Start `python -m rlctl.roles.<role>` as the plan would (collector, replay, evaluator)."""
    env = role_env(role, rank, job_path, endpoints, keys, run_id, binds, extra=extra_env)
    return Proc(f"{role}-{rank}", [sys.executable, "-m", ROLE_MODULES[role]], env, log_dir)


def stop_all(procs: list[Proc], timeout: float = 5.0) -> None:
    """Stop every process (signals all first, so they shut down in parallel)."""
    children.stop([p.popen for p in procs], grace=timeout)
    for p in procs:
        p._log.close()


class TempDir:
    """A temporary directory that is removed on exit unless $RLCTL_BENCH_KEEP is set."""

    def __enter__(self) -> Path:
        self._td = tempfile.TemporaryDirectory(prefix="rlctl-bench-")
        return Path(self._td.name)

    def __exit__(self, *exc) -> None:
        if os.environ.get("RLCTL_BENCH_KEEP"):
            print(f"(kept {self._td.name})", file=sys.stderr)
            return
        self._td.cleanup()


# --------------------------------------------------------------------------- control plane

class ControlRouter:
    """The supervisor's control ROUTER, played by the bench: records hello and heartbeat metrics per sender.

    Runs in a background thread with its own SecureContext. `beats[sender]` is a list of
    (receive time.monotonic(), metrics dict) in arrival order. For senders listed in
    `cpu_pids` (name -> pid) each heartbeat's metrics also get "_cpu_s": that process's CPU
    time (user + system, all threads) when the heartbeat arrived, so rates can be taken per
    CPU-second as well as per wall-second (robust to other load on a shared machine).
    """

    def __init__(self, keys: wire.CurveKeys, endpoint: str):
        self.cpu_pids: dict[str, int] = {}
        self.net = wire.SecureContext(keys)
        self.sock = self.net.server(zmq.ROUTER, endpoint, rcvhwm=1000)
        self.hellos: dict[str, dict] = {}
        self.beats: dict[str, list[tuple[float, dict]]] = {}
        self.bad = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="control-router", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            while True:
                try:
                    _, msg = wire.recv(self.sock, zmq.NOBLOCK, routed=True)
                except zmq.Again:
                    break
                except wire.WireError:
                    self.bad += 1
                    continue
                now = time.monotonic()
                with self._lock:
                    if msg.kind == "hello":
                        self.hellos[msg.sender] = msg.meta
                    elif msg.kind == "heartbeat" and isinstance(msg.meta.get("metrics"), dict):
                        metrics = msg.meta["metrics"]
                        pid = self.cpu_pids.get(msg.sender)
                        if pid is not None:
                            metrics["_cpu_s"] = process_cpu_s(pid)
                        self.beats.setdefault(msg.sender, []).append((now, metrics))

    def series(self, sender: str) -> list[tuple[float, dict]]:
        """A copy of the heartbeats received from `sender` so far."""
        with self._lock:
            return list(self.beats.get(sender, []))

    def wait_hello(self, names: list[str], timeout: float, procs: list[Proc] = ()) -> None:
        """Block until every name said hello (raising if a process died or time ran out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if all(n in self.hellos for n in names):
                    return
            for p in procs:
                p.check()
            time.sleep(0.05)
        raise TimeoutError(f"no hello from {[n for n in names if n not in self.hellos]} within {timeout}s")

    def wait_beats(self, sender: str, count: int, timeout: float, procs: list[Proc] = ()) -> list[tuple[float, dict]]:
        """Block until `sender` has sent `count` heartbeats in all; returns them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.series(sender)
            if len(s) >= count:
                return s
            for p in procs:
                p.check()
            time.sleep(0.05)
        raise TimeoutError(f"{sender}: {len(self.series(sender))} of {count} heartbeats within {timeout}s")

    def rate(self, sender: str, key: str, t0: float, t1: float) -> tuple[float, int]:
        """(d key / dt, heartbeats used) over the heartbeats received in [t0, t1] (a cumulative counter)."""
        pts = [(t, m[key]) for t, m in self.series(sender) if t0 <= t <= t1 and key in m]
        if len(pts) < 2:
            return float("nan"), len(pts)
        (ta, va), (tb, vb) = pts[0], pts[-1]
        return (vb - va) / max(tb - ta, 1e-9), len(pts)

    def cpu_rate(self, sender: str, key: str, t0: float, t1: float) -> float:
        """d key / d(CPU seconds of the sender's process) over the heartbeats received in [t0, t1]."""
        pts = [(m["_cpu_s"], m[key]) for t, m in self.series(sender)
               if t0 <= t <= t1 and key in m and m.get("_cpu_s") == m.get("_cpu_s") and "_cpu_s" in m]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return float("nan")
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    def values(self, sender: str, key: str, t0: float, t1: float) -> list[float]:
        """Values of `key` in heartbeats received in [t0, t1]."""
        return [m[key] for t, m in self.series(sender) if t0 <= t <= t1 and key in m]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.net.close()


# --------------------------------------------------------------------------- reporting

def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    """'MET' / 'MISSED' for a figure against its target."""
    if value != value:  # NaN
        return "MISSED (no data)"
    ok = value >= target if higher_is_better else value <= target
    return "MET" if ok else "MISSED"


def emit_json(obj: dict[str, Any]) -> None:
    """The machine-readable last line."""
    print(json.dumps(obj), flush=True)
