"""Hostile bytes at every socket of training CartPole jobs: nothing crashes, nothing bad is accepted, the jobs solve.

    python bench/fuzz.py [--messages 100000] [--jobs apex,appo] [--cap 300] [--insider]

For each job (jobs/apex.toml: replay shard and control; jobs/appo.toml: the learner's rollout socket and control;
both: the learner's weights publisher), `rlctl run` starts it and, while it trains, this bench sends its share of
--messages to every socket a job member may reach, with a member's own CURVE keys (read from the learner's
environment, as the job's owner can; without them the handshake already refuses everything):
random bytes, and valid messages mutated: flipped and truncated bytes, header fields of the wrong type, array specs
that lie about dtype or shape, extra and missing arrays, shapes and dtypes that differ from the job's layout,
out-of-range actions, senders like `collector-²` or another process's name, forged figures (an evaluator return of
1e9, 1e15 env steps, non-finite values), random subscription frames.

`crashes`: processes of the job that died or restarted during the run, plus runs that failed. `accepted_bad`: forged
figures that reached state.json (an eval return or env-step count no real process reports). Every experience and
rollout sent is invalid by construction; the receivers' `net/dropped` is printed beside what was sent (ZeroMQ itself
refuses some before any role sees them: oversized frames, broken framing). `solved`: every job reached its target.

`--insider` (issue 28) plays one compromised collector host instead: the central-inference jobs (jobs/seed-apex.toml,
jobs/seed-impala.toml) with collector-1's own keys, read from its environment, at every socket those keys reach
(control, weights, inference, replay experience and sampling, rollouts), adding well-formed messages that only the
wrong sender may not send: steps and experience and rollouts as collector-0, `sample` and `priorities` as if a
learner, arrays shaped `[true]` or `[2**39, 2**39, 0]`, NaN and infinite observations, rewards and priorities. There
`accepted_bad` also counts every answer a forged request got (a step answered, a batch served to a collector) and a
final checkpoint with a non-finite weight.

Last line: {"bench": "fuzz", "messages": N, "crashes": 0, "accepted_bad": 0, "solved": true, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

import _children

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rlctl import metric_names as M  # noqa: E402
from rlctl.net import wire  # noqa: E402

FORGED_RETURN, FORGED_STEPS = 1e9, 10**15


def state(run_dir: Path) -> dict:
    """state.json (empty while it is replaced)."""
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def member_keys(run_dir: Path, name: str = "learner-0") -> wire.CurveKeys:
    """A process's keys, from its environment (the learner's agent and central collectors are started with them;
    forked processes show the fork server's)."""
    pid = next(p["pid"] for p in state(run_dir)["processes"] if p["name"] == name)
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    value = next(e.split(b"=", 1)[1] for e in env if e.startswith(wire.KEYS_ENV.encode() + b"="))
    return wire.CurveKeys.from_env(value.decode())


class Mutator:
    """Bad messages from valid templates (and plain noise)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def noise(self) -> list[bytes]:
        r = self.rng
        return [r.randbytes(r.randint(0, 200)) for _ in range(r.randint(1, 4))]

    def mutate(self, frames: list[bytes]) -> list[bytes]:
        """One of several corruptions of an encoded message."""
        r = self.rng
        frames = [bytes(f) for f in frames]
        how = r.randrange(7)
        if how == 0:  # flip bytes anywhere
            i = r.randrange(len(frames))
            b = bytearray(frames[i]) or bytearray(b"\0")
            for _ in range(r.randint(1, 8)):
                b[r.randrange(len(b))] = r.randrange(256)
            frames[i] = bytes(b)
        elif how == 1:  # truncate a frame
            i = r.randrange(len(frames))
            frames[i] = frames[i][: r.randrange(len(frames[i]) + 1)]
        elif how == 2:  # drop or duplicate a frame
            if len(frames) > 1 and r.random() < 0.5:
                frames.pop(r.randrange(1, len(frames)))
            else:
                frames.append(frames[r.randrange(len(frames))])
        else:  # rewrite the header: wrong types, lying array specs
            head = msgpack.unpackb(frames[0], raw=False)
            key = r.choice(["k", "s", "v", "m", "a"])
            bad = [None, -1, 2**63, "x", [], {}, 1.5, "collector-²", "evaluator-0", "learner-99", "\x00" * 5,
                   [["obs", "object", [1]]], [["obs", "float32", [2**40]]], [["", "float32", [1]]],
                   [["obs", "float32", [-1]]], {"metrics": {"env_steps": "x"}}]
            if key == "a" and head.get("a"):
                spec = list(r.choice(head["a"]))
                spec[r.randrange(3)] = r.choice(["float64", "int8", [3, 3], [0], "", None, [1, 2, 3, 4, 5, 6, 7, 8, 9]])
                head["a"][r.randrange(len(head["a"]))] = spec
            else:
                head[key] = r.choice(bad)
            frames[0] = msgpack.packb(head)
        return frames


def experience_templates(rng: np.random.Generator) -> list[dict]:
    """Ape-X experience that breaks the job's layout (CartPole: obs (4,) float32, int64 actions)."""
    n = 64
    good = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "discount": np.full(n, 0.97, np.float32), "priority": np.ones(n, np.float32)}
    return [{**good, "obs": np.zeros((n, 5), np.float32)}, {**good, "action": good["action"].astype(np.int32)},
            {**good, "priority": np.float32(1.0)}, {**good, "": np.zeros(n, np.float32)},
            {k: v for k, v in good.items() if k != "discount"}, {**good, "reward": np.ones(n - 1, np.float32)},
            {**good, "extra": np.zeros(n, np.float32)}]


def rollout_templates(rng: np.random.Generator, T: int, envs: int) -> list[dict]:
    """APPO rollouts that break the job's layout or carry out-of-range actions."""
    good = {"obs": rng.normal(size=(T + 1, envs, 4)).astype(np.float32), "value": np.zeros((T + 1, envs), np.float32),
            "action": rng.integers(0, 2, (T, envs)), "logp": np.full((T, envs), -0.69, np.float32),
            "reward": np.ones((T, envs), np.float32), "terminated": np.zeros((T, envs), bool),
            "done": np.zeros((T, envs), bool), "valid": np.ones((T, envs), bool)}
    return [{**good, "action": np.full((T, envs), 7)}, {**good, "action": np.full((T, envs), -1)},
            {**good, "obs": np.zeros((T, envs, 4), np.float32)}, {**good, "logp": good["logp"].astype(np.float64)},
            {k: v for k, v in good.items() if k != "valid"}]


def control_messages() -> list[tuple[str, str, object]]:
    """Hellos and heartbeats a member could forge: other senders, wrong types, forged figures."""
    return [("heartbeat", "evaluator-0", {"metrics": {M.EVAL_RETURN_MEAN: FORGED_RETURN, M.EVAL_STREAK: 99}}),
            ("heartbeat", "collector-0", {"metrics": {"env_steps": FORGED_STEPS}}),
            ("heartbeat", "collector-0", {"metrics": {"env_steps": "x"}}),
            ("heartbeat", "learner-0", {"rank": "x", "metrics": {}}),
            ("heartbeat", "collector-0", {"metrics": {M.EPISODE_RETURNS: 5}}),
            ("heartbeat", "learner-²", {"metrics": {}}),
            ("heartbeat", "evaluator-0", {"metrics": {M.EVAL_RETURN_MEAN: float("inf"), M.EVAL_STREAK: 99}}),
            ("hello", "replay-7", {"pid": -1}), ("stop", "supervisor", {}), ("heartbeat", "x" * 300, [])]


def true_shaped(frames: list[bytes]) -> list[bytes]:
    """The message with its first array declared `[true]` (bool passes an isinstance int check)."""
    head = msgpack.unpackb(frames[0], raw=False)
    head["a"][0][2] = [True]
    return [msgpack.packb(head), b"\0" * 4, *frames[2:]]


def huge_empty(frames: list[bytes]) -> list[bytes]:
    """The message with its first array declared [2**39, 2**39, 0] and an empty frame: no array numpy can make."""
    head = msgpack.unpackb(frames[0], raw=False)
    head["a"][0][2] = [2**39, 2**39, 0]
    return [msgpack.packb(head), b"", *frames[2:]]


def poisoned(arrays: dict, rng: np.random.Generator) -> dict:
    """`arrays` with NaN and infinities in every float field."""
    out = {}
    for k, a in arrays.items():
        a = np.array(a, copy=True)
        if a.dtype.kind == "f" and a.size:
            flat = a.reshape(-1)
            flat[rng.integers(0, flat.size, 2)] = [np.nan, np.inf]
        out[k] = a
    return out


def insider_pools(job, rng: np.random.Generator) -> dict[str, list[list[bytes]]]:
    """Messages collector-1's keys may not get through, per target: well-formed ones from the wrong sender or of the
    wrong kind, and the structured cases of issue 28."""
    from rlctl.algos.onpolicy.actor import rollout_layout
    from rlctl.envs import probe_space_info

    info = probe_space_info(job.env)
    n_envs = job.env.envs_per_collector
    step = {"obs": rng.normal(size=(n_envs, *info.obs_shape)).astype(np.float32),
            "reward": np.ones(n_envs, np.float32), "terminated": np.zeros(n_envs, bool),
            "truncated": np.zeros(n_envs, bool)}
    steps = [wire.encode("step", "collector-0", 0, {"token": f"forged-{i}", "seq": 0}, step) for i in range(4)]
    own_bad = [wire.encode("step", "collector-1", 0, {"token": "x", "seq": 0}, poisoned(step, rng))]
    pools = {"inference": steps + own_bad + [true_shaped(f) for f in steps[:1]] + [huge_empty(f) for f in steps[:1]]}
    if job.data_path.shard_role:
        n = 64
        item = {k: rng.normal(size=(n, *shape)).astype(dt) for k, (shape, dt) in
                job.algorithm_entry.load("actor").item_layout(job, info).items()}
        item["action"] = rng.integers(0, info.n_actions, n)
        item["priority"] = np.ones(n, np.float32)
        forged = wire.encode("experience", "collector-0", 0, None, item)
        bad = wire.encode("experience", "collector-1", 0, None, poisoned({**item, "priority": np.full(n, 1e30)}, rng))
        pools["experience"] = [forged, bad, true_shaped(forged), huge_empty(forged)]
        pools["sample"] = [wire.encode("sample", "learner-0", 0, {"n": 8}),
                           wire.encode("priorities", "learner-0", 0, None, {"keys": np.arange(8, dtype=np.int64),
                                                                            "priority": np.full(8, 1e30)})]
    else:
        T = job.algorithm.rollout_len
        rollout = {k: np.zeros((rows, n_envs, *shape), dt) for k, (rows, shape, dt) in rollout_layout(T, info).items()}
        rollout["valid"][:] = True
        forged = wire.encode("rollout", "collector-0", 0, None, rollout)
        bad = wire.encode("rollout", "collector-1", 0, None, poisoned(rollout, rng))
        pools["rollouts"] = [forged, bad, true_shaped(forged), huge_empty(forged)]
    pools["control"] = [wire.encode(k, s, 0, m) for k, s, m in control_messages()]
    pools["control"] += [true_shaped(wire.encode("heartbeat", "collector-1", 0, {}, {"x": np.zeros(1, np.float32)}))]
    return {k: [[bytes(f) for f in m] for m in v] for k, v in pools.items()}


def answers(sock: zmq.Socket) -> int:
    """Replies waiting on a socket that forged requests went out on (each one an accepted forgery)."""
    got = 0
    while sock.poll(0):
        sock.recv_multipart()
        got += 1
    return got


def nonfinite_checkpoint(run_dir: Path) -> bool:
    """Whether the run's final checkpoint holds a non-finite weight."""
    import torch

    from rlctl.checkpoint import load_checkpoint

    path = run_dir / "checkpoints" / "latest.pt"
    if not path.exists():
        return False
    model = load_checkpoint(path)["model"]
    return not all(torch.isfinite(t).all() for t in model.values() if t.is_floating_point())


def fuzz_job(name: str, share: int, cap: float, seed: int, tmp: Path, insider: bool = False) -> dict:
    """Run jobs/<name>.toml while sending `share` bad messages to its sockets; figures of the run."""
    text = (REPO / "jobs" / f"{name}.toml").read_text()
    text = re.sub(r"(?m)^wall_s = [\d.]+", f"wall_s = {cap}", text)
    job, runs = tmp / f"{name}.toml", tmp / f"runs-{name}"
    job.write_text(text)
    log = open(tmp / f"{name}.out", "wb")
    sup = _children.spawn([sys.executable, "-m", "rlctl", "run", str(job), "--runs-dir", str(runs)],
                          grace=_children.SUPERVISOR_GRACE_S, stdout=log, stderr=log, env={**os.environ, "TERM": "dumb"})
    deadline = time.time() + 120
    while time.time() < deadline and not (runs.exists() and any(runs.iterdir())):
        time.sleep(0.1)
    run_dir = next(runs.iterdir())
    while time.time() < deadline and not (state(run_dir).get("processes") and all(
            p["state"] == "running" for p in state(run_dir)["processes"])):
        time.sleep(0.1)
    plan = json.loads((run_dir / "plan.json").read_text())
    net = wire.SecureContext(member_keys(run_dir, "collector-1" if insider else "learner-0"))
    eps = plan["endpoints"]
    targets = {"control": net.client(zmq.DEALER, eps["control"], sndhwm=100000)}
    if eps.get("inference"):
        targets["inference"] = net.client(zmq.DEALER, eps["inference"][0], sndhwm=100000)
    targets["weights"] = net.client(zmq.XSUB, eps["weights"], sndhwm=100000)
    if eps.get("replay"):
        targets["experience"] = net.client(zmq.PUSH, eps["replay"][0]["experience"], sndhwm=100000)
        targets["sample"] = net.client(zmq.DEALER, eps["replay"][0]["sample"], sndhwm=100000)
    if eps.get("rollouts"):
        targets["rollouts"] = net.client(zmq.PUSH, eps["rollouts"][0], sndhwm=100000)
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    mut = Mutator(rng)
    from rlctl.job.load import load_job
    spec = load_job(job)
    T, envs = (0, 0) if spec.data_path.shard_role else (spec.algorithm.rollout_len, spec.env.envs_per_collector)
    forged_answers = 0
    experience = [wire.encode("experience", "collector-0", 0, None, a) for a in experience_templates(nrng)]
    rollouts = [wire.encode("rollout", "collector-0", 0, None, a) for a in rollout_templates(nrng, T, envs)] if T else []
    controls = [wire.encode(k, s, 0, m) for k, s, m in control_messages()]
    samples = [wire.encode("sample", "learner-0", 0, {"n": n}) for n in (0, -1, 2**20, "x", None)]
    samples += [wire.encode("priorities", "learner-0", 0, None, {"keys": np.array([1, 2], np.int32),
                                                                  "priority": np.ones(3)})]
    pools = {"control": controls, "experience": experience, "sample": samples, "rollouts": rollouts,
             "inference": []}
    if insider:
        extra = insider_pools(spec, nrng)
        pools = {k: pools[k] + extra.get(k, []) for k in pools}
    sent = skipped = 0
    names = list(targets)
    started = time.time()
    while sent < share and sup.poll() is None:
        target = names[sent % len(names)]
        pick = rng.random()
        if target == "weights":
            frames = [bytes([rng.choice([0, 1, 2, 255])]) + rng.randbytes(rng.randint(0, 40))]
        elif pick < 0.2:
            frames = mut.noise()
        else:
            frames = [bytes(f) for f in rng.choice(pools[target])]
            if pick < 0.6:
                frames = mut.mutate(frames)
        try:
            targets[target].send_multipart(frames, zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            skipped += 1
            time.sleep(0.0005)
        if insider and sent % 256 == 0:
            forged_answers += sum(answers(targets[t]) for t in ("inference", "sample") if t in targets)
    time.sleep(1.0)  # an answer to the last requests would be on its way
    forged_answers += sum(answers(targets[t]) for t in ("inference", "sample") if t in targets)
    fuzzing_ended = time.time()
    net.close()
    sup.wait(timeout=cap + 60)
    end = state(run_dir)
    metrics = end.get("metrics", {})
    hurt = {p["name"]: p.get("restarts", 0) + (p.get("state") == "failed") for p in end.get("processes", [])}
    hurt = {k: v for k, v in hurt.items() if v}
    for name_ in hurt:
        tail = (run_dir / "logs" / f"{name_}.log").read_text(errors="replace").splitlines()[-15:]
        print(f"--- {name_} restarted or failed; its log ends:\n" + "\n".join(tail), flush=True)
    crashed = sum(hurt.values())
    crashed += end.get("status") == "failed"
    accepted = int(metrics.get(M.EVAL_RETURN_MEAN, 0) >= FORGED_RETURN) + int(metrics.get(M.ENV_STEPS, 0) >= FORGED_STEPS)
    accepted += forged_answers + int(nonfinite_checkpoint(run_dir))
    solved = end.get("status") == "finished" and (end.get("stopped_by") or {}).get("criterion") in (
        "eval_return", "train_return")
    print(f"{name}: {sent} bad messages to {', '.join(names)} in {fuzzing_ended - started:.1f} s "
          f"({skipped} sends refused by full queues); {end.get('status')}: {end.get('exit_reason')}; "
          f"net/dropped {metrics.get(M.NET_DROPPED)}, net/refused {metrics.get(M.NET_REFUSED)}; crashes {crashed}"
          + (f"; forged requests answered {forged_answers}" if insider else ""), flush=True)
    return {"messages": sent, "crashes": crashed, "accepted_bad": accepted, "solved": solved,
            "dropped": metrics.get(M.NET_DROPPED, 0)}


def main() -> None:
    _children.install()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--jobs", default=None, help="default apex,appo (seed-apex,seed-impala with --insider)")
    ap.add_argument("--insider", action="store_true", help="play collector-1's host: its keys, every socket")
    ap.add_argument("--cap", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    jobs = (args.jobs or ("seed-apex,seed-impala" if args.insider else "apex,appo")).split(",")
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: fuzz_job(name, -(-args.messages // len(jobs)), args.cap, args.seed, Path(tmp), args.insider)
                   for name in jobs}
    out = {"bench": "fuzz", "insider": args.insider, "messages": sum(r["messages"] for r in results.values()),
           "crashes": sum(r["crashes"] for r in results.values()),
           "accepted_bad": sum(r["accepted_bad"] for r in results.values()),
           "solved": all(r["solved"] for r in results.values()), "by_job": results}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
