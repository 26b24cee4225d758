"""How fast a run recovers: the Ape-X CartPole job with a collector killed, a learner rank killed, and a resume.

    python bench/faults.py [--rounds 3]

One run of jobs/apex.toml (stop target replaced by a long env-step budget, checkpoints every second), and in it,
`--rounds` times each, with the run learning in between:
- collector: SIGKILL of collector-0's process -> its restarted incarnation's first batch sent to the replay shard
  (its `first_batch_sent` event; the supervisor's restart backoff, `topology.restart_backoff_s` = 0.5 s, included);
- learner: SIGKILL of the learner's rank-0 worker -> the first update of the ranks torchrun restarted from the newest
  checkpoint (its `first_update` event, rlctl.events);
- resume: `rlctl stop`, then `rlctl run --resume` invoked -> the resumed learner's first update (new processes,
  torch imports, checkpoint and replay snapshot loads included).
Times come from the events' timestamps (the supervisor stamps each log line as it arrives). Medians are reported.

Then, over SSH test hosts (tests/hostlab.py: one sshd per network namespace; needs root, openssh-server and
iproute2, else skipped), `--host-loss-rounds` times: an APPO run (learner on h1, a collector on h2, two on h3) with
`logging.heartbeat_timeout_s` = 10 and `network.session_timeout_s` = 3, and the network interface of the host that
holds collector-1 taken down -> the moved collectors' first env step on the host left (their `first_env_step`,
the slowest of them), split into the silence before the host is lost and the rest (the wait for a cut-off copy to
have ended itself, session_timeout_s + 5 s, and the collectors' start); then the interface comes back and the host
is re-admitted before the next round.

Then, over SSH test hosts, `--learner-node-rounds` times: the Ape-X job (`--learner-node-algo ppo`: jobs/ppo.toml,
whose collectors send to rank 0, which deals the rollouts) with `topology.min_learner_nodes = 1` and learner nodes
on h1 and h2, h2 taken down (sshd and every process there SIGKILLed) -> the head's first update in the
world left (its `first_update`), the updates it lost (its last before the break minus the checkpoint it went on from),
and h2's sshd back -> the heartbeat that reports a world of 2 again.

Then, `--head-loss-rounds` times, the same job with checkpoints every 10 s and the head's host taken down -> the first
update of the head on the other learner host, in the run's next segment (the supervisor ends the segment once ssh
cannot reach the head through its restarts), the updates lost (the most reported before the loss minus the
checkpoint the new head went on from), and the lost host's sshd back -> a world of 2 again. The head moves between
h1 and h2, a segment each round.

Then, on a test Slurm cluster (tests/slurmlab.py: three nodes; needs root and slurm-wlm, else skipped),
`--preempt-rounds` times: an `rlctl run --sbatch` of jobs/apex-slurm.toml requeued mid-run by `scontrol requeue` ->
its first update in the next allocation (the lab lets a requeued job start again after 10 s; Slurm's default is
120 s), the learner updates it reported before the preemption that its resumed learner no longer had, and the replay
transitions that did not come back (the shard's snapshot written at the preemption minus the one it loaded).

Last line: {"bench": "faults", "collector_recover_s": ..., "learner_recover_s": ..., "resume_first_update_s": ...,
"host_loss_to_step_s": ..., "learner_node_loss_to_update_s": ...,
"learner_node_rejoin_s": ..., "learner_node_updates_lost": ..., "head_loss_to_update_s": ...,
"head_loss_updates_lost": ..., "head_loss_rejoin_s": ..., "preempt_to_update_s": ..., "preempt_updates_lost": ..., "preempt_replay_lost": ...}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _children

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from rlctl import events  # noqa: E402


def job_text(job: str = "apex") -> str:
    """The shipped Ape-X job (or `job`), running until stopped here, with checkpoints every second."""
    text = (REPO / "jobs" / f"{job}.toml").read_text()
    text = re.sub(r"(?ms)^\[job\.stop\]\n.*?\n\n", "[job.stop]\nenv_steps = 100000000\nwall_s = 1200\n\n", text)
    text = text.replace("[topology]\n", "[topology]\nlearner_max_restarts = 100\nmax_restarts = 100\n")
    return text + "\n[logging]\ncheckpoint_interval_s = 1.0\n"


def state(run_dir: Path) -> dict:
    """state.json (empty while being replaced)."""
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def wait(predicate, timeout: float, what: str):
    """Poll until predicate() is truthy and return it; fail after timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"faults: timed out waiting for {what}")


def first_event_after(run_dir: Path, name: str, event: str, after: float) -> float | None:
    """Timestamp of the first `event` in logs/<name>.log stamped after `after`."""
    found = events.first(run_dir / "logs" / f"{name}.log", event, after=after)
    return found.ts if found else None


def row(run_dir: Path, name: str) -> dict:
    """One process's row of state.json."""
    return next((p for p in state(run_dir).get("processes", []) if p.get("name") == name), {})


def learning(run_dir: Path, more_than: int) -> bool:
    """The learner has passed `more_than` updates."""
    return state(run_dir).get("metrics", {}).get("learner/updates", 0) > more_than


def rank_workers(agent: int) -> list[int]:
    """The torchrun agent's children: its rank processes."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == agent:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def start(args: list[str], log: Path):
    """`rlctl ARGS`, attached (its live output to `log`), stopped with this bench."""
    return _children.spawn([sys.executable, "-m", "rlctl", *args], grace=_children.SUPERVISOR_GRACE_S,
                           stdout=open(log, "ab"), stderr=open(log, "ab"), env={**os.environ, "TERM": "dumb"})


HOST_LOSS_HEARTBEAT_S = 10.0


def host_loss_job(lab, workdir: Path) -> str:
    """The APPO job spread over lab hosts h1 (learner), h2 (a collector) and h3 (two), running until stopped."""
    text = (REPO / "jobs" / "appo.toml").read_text()
    text = re.sub(r"(?m)^(collectors|evaluator) = .*\n", "", text)
    text = re.sub(r"(?m)^train_return = .*$", "train_return = 1e9", text)
    text = re.sub(r"(?m)^wall_s = .*$", "wall_s = 1200", text)
    for i, counts in enumerate([{"learner": True}, {"collectors": 1}, {"collectors": 2}]):
        (workdir / f"h{i + 1}").mkdir(exist_ok=True)
        text += "\n" + lab.host_toml(lab.hosts[i], sys.executable, str(workdir / f"h{i + 1}"), **counts)
    return text + (f"\n[logging]\nheartbeat_timeout_s = {HOST_LOSS_HEARTBEAT_S}\n"
                   "\n[network]\nsession_timeout_s = 3.0\n")


def host_row(run_dir: Path, name: str) -> dict:
    """One host's row of state.json."""
    return next((h for h in state(run_dir).get("host_rows", []) if h.get("name") == name), {})


@contextlib.contextmanager
def lab_run(what: str, make_job):
    """A run of the job `make_job(lab, workdir)` writes, on three SSH test hosts (tests/hostlab.py), attached and
    stopped on leaving: yields (lab, run directory), or None where the lab cannot cut a host off."""
    from hostlab import HostLab

    with tempfile.TemporaryDirectory() as tmp, HostLab(Path(tmp), 3).start() as lab:
        if not lab.netns:
            print(f"{what}: skipped (no network namespaces: {lab.netns_error})", flush=True)
            yield None
            return
        job, runs = Path(tmp) / "job.toml", Path(tmp) / "runs"
        job.write_text(make_job(lab, Path(tmp)))
        sup = start(["run", str(job), "--runs-dir", str(runs)], Path(tmp) / "rlctl.out")
        try:
            yield lab, wait(lambda: runs.exists() and next(runs.iterdir(), None), 60, "the run directory")
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(timeout=_children.SUPERVISOR_GRACE_S + 30)


def host_loss(rounds: int) -> list[tuple[float, float]] | None:
    """Per round: seconds from a collector host's interface going down to its collectors' first env step on the
    host left, and of those, the silence before the host was lost. None where the lab cannot cut a host off."""
    with lab_run("host loss", host_loss_job) as ran:
        if ran is None:
            return None
        lab, run_dir = ran
        out = []
        for _ in range(rounds):
            wait(lambda: (procs := state(run_dir).get("processes")) and all(p["state"] == "running" for p in procs),
                 120, "every process running")
            victim = row(run_dir, "collector-1")["host"]
            # Its collectors move; its weights relay is lost with it.
            moving = [p["name"] for p in state(run_dir)["processes"] if p["host"] == victim and p["role"] != "relay"]
            netns = lab.hosts[int(victim[1:]) - 1].netns
            t0 = time.time()
            subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
            try:
                steps = [wait(lambda: first_event_after(run_dir, n, "first_env_step", t0), 180, f"{n} elsewhere")
                         for n in moving]
                lost = wait(lambda: ((host_row(run_dir, victim).get("loss") or {}).get("lost_at") or 0) > t0
                            and host_row(run_dir, victim)["loss"]["lost_at"], 30, f"{victim} lost")
            finally:
                subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
            out.append((max(steps) - t0, lost - t0))
            print(f"host {victim} cut off: lost after {lost - t0:.1f} s, {', '.join(moving)} stepping elsewhere "
                  f"after {max(steps) - t0:.1f} s", flush=True)
            wait(lambda: ((host_row(run_dir, victim).get("loss") or {}).get("back_at") or 0) > t0, 120,
                 f"{victim} back")
        return out


def learner_node_job(lab, workdir: Path, algo: str = "apex") -> str:
    """The Ape-X (or PPO: jobs/ppo.toml) job with elastic learners on lab hosts h1 (the head: learner, Ape-X's shard,
    a collector) and h2 (a learner node), a collector on h3, running until stopped."""
    text = job_text() if algo == "apex" else job_text("ppo")
    text = re.sub(r"(?m)^(collectors|evaluator) = .*\n", "", text)
    text = text.replace("[topology]\n", "[topology]\nmin_learner_nodes = 1\n")
    head = {"learner": True, "collectors": 1, **({"replay_shards": 1} if algo == "apex" else {})}
    for i, counts in enumerate([head, {"learner": True}, {"collectors": 1}]):
        (workdir / f"h{i + 1}").mkdir(exist_ok=True)
        text += "\n" + lab.host_toml(lab.hosts[i], sys.executable, str(workdir / f"h{i + 1}"), **counts)
    return text


def worlds(run_dir: Path) -> list[list]:
    """The learner group's sizes so far, [time, ranks] each."""
    return state(run_dir).get("learner_worlds", [])


def learner_node_loss(rounds: int, algo: str = "apex") -> list[tuple[float, float, int]] | None:
    """Per round: seconds from a learner node's host taken down (sshd and every process there SIGKILLed) to the
    head's first update in the world left, seconds from its sshd back to a world of 2 again, and the updates the
    head's rank lost (made before the break, not in the checkpoint it went on from). None without the lab."""
    with lab_run(f"{algo} learner node loss", lambda lab, workdir: learner_node_job(lab, workdir, algo)) as ran:
        if ran is None:
            return None
        lab, run_dir = ran
        out = []
        warm = 500 if algo == "apex" else 50  # updates before each round (PPO makes far fewer a second)
        for _ in range(rounds):
            wait(lambda: worlds(run_dir) and worlds(run_dir)[-1][1] == 2 and learning(run_dir, warm), 180,
                 "a world of 2 learning")
            sizes, t0 = len(worlds(run_dir)), time.time()
            lab.take_down(lab.hosts[1])
            t1 = wait(lambda: first_event_after(run_dir, "learner-0", "first_update", t0), 120, "the world of 1")
            lines = (run_dir / "logs" / "learner-0.log").read_text()
            broke = int(re.findall(r"the learner group broke after update (\d+)", lines)[-1])
            resumed = events.first(run_dir / "logs" / "learner-0.log", "resumed", after=t0)["update"]
            lab.bring_back(lab.hosts[1])
            t2 = time.time()
            t3 = wait(lambda: len(worlds(run_dir)) >= sizes + 2 and worlds(run_dir)[-1][1] == 2 and worlds(run_dir)[-1][0],
                      180, "a world of 2 again")
            out.append((t1 - t0, t3 - t2, broke - resumed))
            print(f"{algo}: learner node's host taken down: the head's first update in a world of 1 after {t1 - t0:.1f} s "
                  f"({broke - resumed} updates lost); sshd back: a world of 2 after {t3 - t2:.1f} s", flush=True)
        return out


HEAD_CHECKPOINT_S = 10.0  # logging.checkpoint_interval_s of the head-loss rounds: what a lost head may cost


def head_loss(rounds: int, algo: str = "apex") -> list[tuple[float, int, float]] | None:
    """Per round: seconds from the head's host taken down (sshd and every process there SIGKILLed) to the first update
    of the head on the other learner host, in the run's next segment; the updates lost (the most the supervisor heard
    of before the loss minus the checkpoint the new head went on from); and seconds from the lost host's sshd back to
    a world of 2 again. The head moves back and forth between h1 and h2, a segment each round. None without the lab."""
    def job(lab, workdir: Path) -> str:
        return learner_node_job(lab, workdir, algo).replace("checkpoint_interval_s = 1.0",
                                                             f"checkpoint_interval_s = {HEAD_CHECKPOINT_S}")

    with lab_run(f"{algo} head loss", job) as ran:
        if ran is None:
            return None
        lab, run_dir = ran
        out = []
        warm = 500 if algo == "apex" else 50
        for _ in range(rounds):
            wait(lambda: worlds(run_dir) and worlds(run_dir)[-1][1] == 2 and learning(run_dir, warm)
                 and (state(run_dir).get("checkpoints_home") or {}).get("at", 0) > state(run_dir)["segments"][-1][
                     "started_at"], 180, "a world of 2 learning, a checkpoint of this segment home")
            head, segments = row(run_dir, "learner-0")["host"], len(state(run_dir).get("segments", []))
            before = state(run_dir)["metrics"]["learner/updates"]
            t0 = time.time()
            lab.take_down(lab.hosts[int(head[1:]) - 1])
            t1 = wait(lambda: len(state(run_dir).get("segments", [])) > segments
                      and first_event_after(run_dir, "learner-0", "first_update", t0), 180, "the head elsewhere")
            resumed = events.first(run_dir / "logs" / "learner-0.log", "resumed", after=t0)["update"]
            lab.bring_back(lab.hosts[int(head[1:]) - 1])
            t2 = time.time()
            t3 = wait(lambda: worlds(run_dir) and worlds(run_dir)[-1][1] == 2 and worlds(run_dir)[-1][0] > t2
                      and worlds(run_dir)[-1][0], 180, "a world of 2 again")
            out.append((t1 - t0, before - resumed, t3 - t2))
            print(f"{algo}: head's host {head} taken down: the first update of the head on "
                  f"{row(run_dir, 'learner-0')['host']} after {t1 - t0:.1f} s ({before - resumed} updates lost, "
                  f"checkpoints every {HEAD_CHECKPOINT_S:g} s); sshd back: a world of 2 after {t3 - t2:.1f} s", flush=True)
        return out


def last_event(log: Path, name: str, after: float, before: float):
    """The last `name` event in `log` stamped between `after` and `before` (None if there is none)."""
    found = [e for e in events.read(log) if e.name == name and after < (e.ts or 0) < before]
    return found[-1] if found else None


def preemption(rounds: int) -> list[tuple[float, int, int]] | None:
    """Per round: seconds from `scontrol requeue` to the first update in the next allocation, learner updates lost,
    replay transitions lost. None where a Slurm lab cannot run."""
    import slurmlab
    from jobfiles import shipped_job

    if slurmlab.unavailable() is not None:
        print(f"preemption: skipped ({slurmlab.unavailable()})", flush=True)
        return None
    with tempfile.TemporaryDirectory() as tmp, slurmlab.SlurmLab(Path(tmp), 3, cred_expire_s=10) as lab:
        job = shipped_job(Path(tmp), "apex-slurm", name="bench-preempt", stop="env_steps = 100000000", wall_s=1200,
                          drop=("collectors", "evaluator", "replay_shards"), drop_sections=("cluster",),
                          extra='\n[cluster]\nscheduler = "slurm"\n[logging]\ncheckpoint_interval_s = 2.0\n')
        runs = Path(tmp) / "runs"
        out = subprocess.run([sys.executable, "-m", "rlctl", "run", "--sbatch", str(job), "--nodes", "3", "--time",
                              "30:00", "--runs-dir", str(runs)], env=lab.env, cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            raise SystemExit(f"faults: rlctl run --sbatch failed: {out.stderr.strip()}")
        run_dir, job_id = runs / out.stdout.strip(), re.search(r"Slurm job (\d+)", out.stderr).group(1)
        learner_log, replay_log = run_dir / "logs" / "learner-0.log", run_dir / "logs" / "replay-0.log"
        found, floor = [], 500
        try:
            for _ in range(rounds):
                # Past the updates it had before (a resumed run's state shows those from its start on).
                wait(lambda: state(run_dir).get("status") == "running" and learning(run_dir, floor), 180,
                     "a learning run")
                t0 = time.time()
                lab.slurm("scontrol", "requeue", job_id)
                wait(lambda: state(run_dir).get("status") == "preempted", 60, "the run marked preempted")
                reported = int(state(run_dir)["metrics"].get("learner/updates", 0))
                floor = reported + 500
                t1 = wait(lambda: first_event_after(run_dir, "learner-0", "first_update", t0), 240, "the next update")
                resumed = events.first(learner_log, "resumed", after=t0)
                loaded = events.first(replay_log, "snapshot_loaded", after=t0)
                written = last_event(replay_log, "snapshot_written", t0, loaded.ts) if loaded else None
                found.append((t1 - t0, reported - int(resumed["update"]),
                              int(written["size"]) - int(loaded["size"]) if written and loaded else -1))
                print(f"requeued: first update in the next allocation after {t1 - t0:.1f} s; updates lost "
                      f"{found[-1][1]} (reported {reported}, resumed at {resumed['update']}); replay transitions "
                      f"lost {found[-1][2]}", flush=True)
        finally:
            lab.slurm("scancel", job_id)
            lab.settle()
        return found


def local_faults(rounds: int) -> dict[str, list[float]]:
    """Seconds per round on this machine: collector kill -> first batch, learner rank kill -> first update,
    --resume -> first update."""
    out: dict[str, list[float]] = {"collector": [], "learner": [], "resume": []}
    if rounds < 1:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        job, runs, log = Path(tmp) / "apex.toml", Path(tmp) / "runs", Path(tmp) / "rlctl.out"
        job.write_text(job_text())
        sup = start(["run", str(job), "--runs-dir", str(runs)], log)
        run_dir = wait(lambda: runs.exists() and next(runs.iterdir(), None), 60, "the run directory")
        for r in range(rounds):
            wait(lambda: learning(run_dir, 1000) and row(run_dir, "collector-0").get("state") == "running", 120,
                 "a learning run")
            pgid, t0 = row(run_dir, "collector-0")["pid"], time.time()
            os.killpg(pgid, signal.SIGKILL)
            t1 = wait(lambda: first_event_after(run_dir, "collector-0", "first_batch_sent", t0), 60, "the collector")
            out["collector"].append(t1 - t0)
            print(f"collector-0 killed: first batch sent after {t1 - t0:.2f} s", flush=True)

            wait(lambda: (run_dir / "checkpoints" / "latest.pt").exists(), 60, "a checkpoint")
            workers = rank_workers(row(run_dir, "learner-0")["pid"])
            t0 = time.time()
            os.kill(workers[0], signal.SIGKILL)
            t1 = wait(lambda: first_event_after(run_dir, "learner-0", "first_update", t0), 120, "the learner")
            out["learner"].append(t1 - t0)
            print(f"learner rank killed: first update after {t1 - t0:.2f} s", flush=True)

            wait(lambda: learning(run_dir, 0) and row(run_dir, "learner-0").get("state") == "running", 60, "learning")
            sup.send_signal(signal.SIGTERM)  # what Ctrl-C does: a clean stop
            sup.wait(timeout=_children.SUPERVISOR_GRACE_S + 10)
            t0 = time.time()
            sup = start(["run", "--resume", run_dir.name, "--runs-dir", str(runs)], log)
            t1 = wait(lambda: first_event_after(run_dir, "learner-0", "first_update", t0), 120, "the resumed learner")
            out["resume"].append(t1 - t0)
            print(f"run --resume: first update after {t1 - t0:.2f} s (round {r + 1})", flush=True)
        sup.send_signal(signal.SIGTERM)
        sup.wait(timeout=_children.SUPERVISOR_GRACE_S + 10)
    return out


def median(xs) -> float | None:
    """The median, rounded; None of nothing."""
    xs = list(xs)
    return round(statistics.median(xs), 3) if xs else None


def main() -> None:
    _children.install()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host-loss-rounds", type=int, default=2, help="rounds over SSH test hosts (0: none)")
    ap.add_argument("--learner-node-rounds", type=int, default=2, help="elastic learner rounds over SSH test hosts")
    ap.add_argument("--learner-node-algo", choices=("apex", "ppo"), default="apex",
                    help="the elastic learner rounds' job: jobs/apex.toml, or jobs/ppo.toml (rank 0 deals rollouts)")
    ap.add_argument("--head-loss-rounds", type=int, default=2, help="elastic head host losses over SSH test hosts")
    ap.add_argument("--preempt-rounds", type=int, default=2, help="rounds on a test Slurm cluster (0: none)")
    args = ap.parse_args()
    out = local_faults(args.rounds)
    hosts = host_loss(args.host_loss_rounds) if args.host_loss_rounds > 0 else None
    nodes = learner_node_loss(args.learner_node_rounds, args.learner_node_algo) if args.learner_node_rounds > 0 else None
    heads = head_loss(args.head_loss_rounds, args.learner_node_algo) if args.head_loss_rounds > 0 else None
    preempts = preemption(args.preempt_rounds) if args.preempt_rounds > 0 else None
    result = {"bench": "faults", "rounds": args.rounds,
              "collector_recover_s": median(out["collector"]),
              "learner_recover_s": median(out["learner"]),
              "resume_first_update_s": median(out["resume"]),
              "host_loss_to_step_s": median(t for t, _ in hosts or []),
              "host_loss_detect_s": median(d for _, d in hosts or []),
              "host_loss_heartbeat_timeout_s": HOST_LOSS_HEARTBEAT_S,
              "learner_node_algo": args.learner_node_algo,
              "learner_node_loss_to_update_s": median(t for t, _, _ in nodes or []),
              "learner_node_rejoin_s": median(r for _, r, _ in nodes or []),
              "learner_node_updates_lost": max(u for _, _, u in nodes) if nodes else None,
              "head_loss_to_update_s": median(t for t, _, _ in heads or []),
              "head_loss_updates_lost": max(u for _, u, _ in heads) if heads else None,
              "head_loss_rejoin_s": median(r for _, _, r in heads or []),
              "preempt_to_update_s": median(t for t, _, _ in preempts or []),
              "preempt_updates_lost": max(u for _, u, _ in preempts) if preempts else None,
              "preempt_replay_lost": max(r for _, _, r in preempts) if preempts else None,
              "all_s": {**{k: [round(x, 3) for x in v] for k, v in out.items()},
                        "host_loss": [round(t, 3) for t, _ in hosts or []],
                        "learner_node_loss": [round(t, 3) for t, _, _ in nodes or []],
                        "head_loss": [round(t, 3) for t, _, _ in heads or []],
                        "preempt": [round(t, 3) for t, _, _ in preempts or []]}}
    print(f"median seconds: collector kill -> first batch {result['collector_recover_s']}, learner kill -> first "
          f"update {result['learner_recover_s']}, --resume -> first update {result['resume_first_update_s']}, "
          f"collector host cut off -> its collectors stepping elsewhere {result['host_loss_to_step_s']} "
          f"(heartbeat_timeout_s = {HOST_LOSS_HEARTBEAT_S:g}), learner node's host lost -> the head's next update "
          f"{result['learner_node_loss_to_update_s']} (updates lost {result['learner_node_updates_lost']}; back -> "
          f"world of 2 {result['learner_node_rejoin_s']}), head's host lost -> the new head's first update "
          f"{result['head_loss_to_update_s']} (updates lost {result['head_loss_updates_lost']}, checkpoints every "
          f"{HEAD_CHECKPOINT_S:g} s; back -> world of 2 {result['head_loss_rejoin_s']}), Slurm requeue -> first update in the next allocation "
          f"{result['preempt_to_update_s']} (updates lost {result['preempt_updates_lost']}, replay transitions lost "
          f"{result['preempt_replay_lost']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
