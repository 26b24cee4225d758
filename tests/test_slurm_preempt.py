"""A Slurm batch run whose allocation ends under it (tests/slurmlab.py): requeued mid-run by `scontrol requeue`, or
warned of its time limit (SIGUSR1) allocation after allocation, it checkpoints, says `preempted`, and its next
allocation resumes the same run directory until the run reaches its target.

Its own lab: step credentials live 10 s (Slurm's cred_expire, 120 s by default), which is also how long a requeued
job waits before it may start again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlctl import events
from conftest import REPO, read_state, run_cli, wait_for
from jobfiles import shipped_job
import slurmlab

CAP_S = 300
pytestmark = [pytest.mark.slow, pytest.mark.skipif(slurmlab.unavailable() is not None, reason=str(slurmlab.unavailable()))]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Three Slurm nodes for the whole module; a requeued job may start again 10 s after."""
    yield from slurmlab.module_lab(tmp_path_factory, 3, cred_expire_s=10)


@pytest.fixture(autouse=True)
def idle_cluster(lab):
    """Every test leaves the nodes idle (its job cancelled if it is left)."""
    yield
    why = lab.settle()
    if why is not None:
        pytest.fail(f"the Slurm nodes were not idle after the test:\n{why}")


def submit(lab, tmp_path: Path, name: str, stop: str, time_limit: str, cluster: str = "",
           wall_s: float = CAP_S) -> tuple[Path, int]:
    """`rlctl run --sbatch` of the Ape-X job stopping at `stop`: (its run directory, the Slurm job id)."""
    runs = tmp_path / "runs"
    job = shipped_job(tmp_path, "apex-slurm", name=name, stop=stop, wall_s=wall_s,
                      drop=("collectors", "evaluator", "replay_shards"), drop_sections=("cluster",),
                      extra=f'\n[cluster]\nscheduler = "slurm"\n{cluster}\n[logging]\ncheckpoint_interval_s = 2.0\n')
    out = run_cli(["run", "--sbatch", str(job), "--nodes", "3", "--time", time_limit, "--runs-dir", str(runs)],
                  env=lab.env, cwd=REPO)
    run_id = out.stdout.strip()
    script = (runs / run_id / "sbatch.sh").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@" in script, script
    return runs / run_id, int(re.search(r"Slurm job (\d+)", out.stderr).group(1))


def tb_steps(tb_dir: Path, tag: str) -> list[int]:
    """The steps of `tag` in every TensorBoard event file of the run, file after file (each segment writes one)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = []
    for path in sorted(tb_dir.rglob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        steps += [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
    return steps


def replay_reloads(run_dir: Path) -> list[tuple[int, int]]:
    """(size of the replay shard's last snapshot written, size of the snapshot it loaded next) for each time a
    start of the shard loaded one: one log across allocations, oldest first."""
    last, out = 0, []
    for e in events.read(run_dir / "logs" / "replay-0.log"):
        if e.name == "snapshot_written":
            last = e["size"]
        elif e.name == "snapshot_loaded":
            out.append((last, e["size"]))
    return out


def assert_resumed_whole(run_dir: Path, allocations: int, criterion: str = "charts/env_steps") -> dict:
    """The run finished by its target across `allocations` or more allocations, in one directory: one segment and
    one supervisor start each, TensorBoard's steps rising, the replay back at least as full as it was left."""
    state = read_state(run_dir)
    assert state["status"] == "finished" and state["exit_reason"].startswith(criterion), state["exit_reason"]
    assert len(state["segments"]) >= allocations and len(state["preemptions"]) == len(state["segments"]) - 1, state
    # One point per metrics interval, at the env steps then. A segment's last point, written at its stop, may share
    # the step of the one before (no env step between them: a clean-clone CI's 16332, 16332); a resumed segment's
    # points start past the last step of those before (a step axis started again would go down).
    steps = tb_steps(run_dir / "tb", "losses/td_loss")
    assert len(steps) > 4 and all(a <= b for a, b in zip(steps, steps[1:])), steps
    reloads = replay_reloads(run_dir)
    assert len(reloads) >= allocations - 1 and all(loaded >= written > 0 for written, loaded in reloads), reloads
    return state


def test_scontrol_requeue_mid_run_resumes_the_same_run_directory(lab, tmp_path):
    run_dir, job_id = submit(lab, tmp_path, "slurm-requeue", "env_steps = 60000", "10:00")
    wait_for(lambda: read_state(run_dir).get("status") == "running"
             and read_state(run_dir).get("metrics", {}).get("charts/env_steps", 0) >= 15_000, 180,
             what="15k env steps in the first allocation")
    before = read_state(run_dir)["metrics"]
    assert lab.slurm("scontrol", "requeue", str(job_id)).returncode == 0
    wait_for(lambda: read_state(run_dir).get("status") == "preempted", 30, what="the run marked preempted")
    state = read_state(run_dir)
    assert state["exit_reason"].startswith(f"preempted: Slurm job {job_id} was requeued"), state["exit_reason"]
    assert state["preemptions"][-1]["requeued_by"] == "slurm"
    shown = json.loads(run_cli(["status", run_dir.name, "--json", "--runs-dir", str(run_dir.parent)],
                               env=lab.env).stdout)
    assert shown["status"] in ("preempted", "queued"), shown["status"]
    wait_for(lambda: read_state(run_dir).get("status") in ("finished", "failed", "stopped"), CAP_S,
             what="the run's end in its next allocation")
    state = assert_resumed_whole(run_dir, 2)
    assert state["metrics"]["charts/env_steps"] >= 60_000 > before["charts/env_steps"]
    assert replay_reloads(run_dir)[0][1] >= before.get("replay/size", 1), (replay_reloads(run_dir), before)


def test_a_run_longer_than_its_time_limit_finishes_across_allocations(lab, tmp_path):
    # A 2-minute limit warned 30 s before, so at 90 s, or up to 60 s earlier (Slurm's resolution): between 30 and
    # 90 s of each allocation. With a 1-minute limit the warning came 15 s into each allocation of a loaded
    # clean-clone CI, before the processes had started: no env step in any of three. The target is 100 s of run
    # time over all segments, which no single allocation can hold (an env-step target is met in one allocation on a
    # fast machine: 120k env steps took 18 s on a quiet CI machine).
    run_dir, job_id = submit(lab, tmp_path, "slurm-timelimit", "", "2", "signal_grace_s = 30\n", wall_s=100)
    wait_for(lambda: read_state(run_dir).get("status") in ("finished", "failed", "stopped"), 4 * CAP_S,
             what="the run's end")
    state = assert_resumed_whole(run_dir, 2, criterion="wall time")
    assert all(p["reason"].endswith("nears its time limit (SIGUSR1)") for p in state["preemptions"]), state
