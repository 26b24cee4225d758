"""Wall time of `rlctl --help` and `rlctl status` (100 runs present), and what those paths import.

Usage: python bench/cli_latency.py [--quick] [--runs N] [--reps N]

Times the installed `rlctl` console script (the one in this interpreter's scripts folder;
`python -m rlctl` if there is none) as a user's shell would run it, over >= 10 invocations
each after one untimed warm-up, median reported. `status` runs against a temporary
RLCTL_RUNS_DIR holding 100 fake runs whose job.toml, plan.json (rendered by
rlctl.launch.plan.make_plan) and state.json (shaped like the supervisor's) are realistic; a few
are "running" under a live pid, a few "lost", the rest finished/stopped/failed.

Then, for each path, a child python imports rlctl.cli, invokes the app with those args
(standalone_mode=False) and reports whether torch, numpy, matplotlib and pydantic (and a few more)
ended up in sys.modules. Target: <= 0.3 s each, none of torch, numpy, matplotlib imported.

Last line: {"bench": "cli_latency", "help_s": ..., "status_s": ..., "torch_imported": false, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

TARGET_S = 0.3
HEAVY = ("torch", "numpy", "matplotlib", "tensorboard", "wandb", "pydantic", "zmq", "gymnasium", "rich", "msgpack")

CHILD = r"""
import contextlib, io, json, sys
args = json.loads(sys.argv[1])
from rlctl.cli import app
out = io.StringIO()
code = 0
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        r = app(args, standalone_mode=False, prog_name="rlctl")
        code = r if isinstance(r, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    except Exception as e:  # click.exceptions.Exit and friends
        code = getattr(e, "exit_code", repr(e))
heavy = json.loads(sys.argv[2])
print(json.dumps({"modules": {m: m in sys.modules for m in heavy}, "code": code, "chars": len(out.getvalue())}))
"""


def rlctl_command() -> tuple[list[str], str]:
    """The installed console script next to this interpreter, else `python -m rlctl`."""
    script = Path(sysconfig.get_path("scripts")) / "rlctl"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)], str(script)
    return [sys.executable, "-m", "rlctl"], f"{sys.executable} -m rlctl"


def make_runs(root: Path, n: int) -> list[str]:
    """n fake run directories like `rlctl run` leaves them (job.toml, plan.json, state.json, logs/...)."""
    from rlctl.launch.plan import make_plan
    from rlctl.job.load import load_job
    from rlctl.job.resolved import resolved_dict
    from rlctl.job.toml_writer import dumps_toml

    spec = load_job(H.APEX_JOB)
    job_toml = dumps_toml(resolved_dict(spec))
    rng = random.Random(0)
    dead_pid = _dead_pid()
    base_t = time.time() - n * 3600
    ids = []
    for i in range(n):
        started = base_t + i * 3600 + rng.uniform(0, 600)
        run_id = f"{spec.job.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}"
        path = root / run_id
        for sub in ("logs", "tb", "checkpoints"):
            (path / sub).mkdir(parents=True)
        (path / "job.toml").write_text(job_toml)
        plan = make_plan(spec, run_id, str(path), 20000 + 16 * i, python=sys.executable)
        (path / "plan.json").write_text(plan.to_json())
        for proc in plan.processes:
            (path / "logs" / f"{proc.name}.log").write_text(f"2026-01-01T00:00:00.000 {proc.name}: started\n")
        if i >= n - 2:
            status, sup = "running", os.getpid()  # alive: shown as running
        elif i >= n - 5:
            status, sup = "running", dead_pid  # supervisor gone: shown as lost
        else:
            status, sup = rng.choice(["finished"] * 7 + ["stopped"] * 2 + ["failed"]), dead_pid
        ended = None if status == "running" else started + rng.uniform(60, 600)
        state = _state(run_id, spec.job.name, status, sup, started, ended, plan, rng)
        (path / "state.json").write_text(json.dumps(state, indent=1) + "\n")
        ids.append(run_id)
    return ids


def _dead_pid() -> int:
    p = H.children.spawn([sys.executable, "-c", "pass"], new_session=False)
    p.wait()
    H.children.stop([p])  # gone already: only forgets it
    return p.pid


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, registered so the child ends with the bench (as plain a start as subprocess.run's: the
    bench's process group as a shell's child would share its job's, no preexec_fn, so the timings are unchanged)."""
    return H.children.run(cmd, new_session=False, pdeathsig=False, **kwargs)


def _state(run_id, job, status, sup_pid, started, ended, plan, rng) -> dict:
    units = {"replay": ("replay/insert_per_s", "inserts/s"), "learner": ("learner/updates_per_s", "updates/s"),
             "evaluator": ("eval/return_mean", "eval return"), "collector": ("charts/env_steps_per_s", "env steps/s")}
    now = ended or time.time()
    procs = []
    for k, p in enumerate(plan.processes):
        procs.append({"name": p.name, "role": p.role, "rank": p.rank, "host": p.host, "pid": 10000 + k,
                      "pgid": 10000 + k, "state": "running" if status == "running" else "stopped", "restarts": 0,
                      "exit_code": None if status == "running" else 0, "rate": rng.uniform(10, 10000),
                      "rate_unit": units[p.role][1], "last_heartbeat": now - rng.uniform(0, 1)})
    steps = rng.randint(10_000, 2_000_000)
    metrics = {"charts/env_steps": steps, "charts/env_steps_per_s": rng.uniform(5000, 20000),
               "charts/episodes": steps // 30, "charts/episode_return_mean": rng.uniform(10, 500),
               "charts/episode_length_mean": rng.uniform(10, 500), "losses/td_loss": rng.uniform(0, 1),
               "learner/q_mean": rng.uniform(0, 100), "learner/updates": steps // 20,
               "learner/updates_per_s": rng.uniform(100, 400), "learner/samples_per_s": rng.uniform(1e4, 5e4),
               "learner/version": steps // 20, "learner/data_wait_frac": rng.uniform(0, 1),
               "replay/size": 50000.0, "replay/insert_per_s": rng.uniform(1000, 10000),
               "replay/sampled_per_s": rng.uniform(1e4, 6e4), "replay/inserted": float(steps),
               "collector/weight_version_lag": 30.0, "eval/return_mean": rng.uniform(10, 500),
               "eval/length_mean": rng.uniform(10, 500), "eval/version": steps // 20, "net/dropped": 0,
               "net/refused": 0}
    failure = ({"process": "learner-0", "exit_code": 1, "log_tail": ["Traceback (most recent call last):",
                                                                     "RuntimeError: boom"]}
               if status == "failed" else None)
    reason = {"finished": "eval/return_mean 480.0 >= 475", "stopped": "stopped by SIGTERM",
              "failed": "learner-0 exited with 1", "running": None}[status]
    return {"run_id": run_id, "job": job, "algorithm": "apex", "status": status, "supervisor_pid": sup_pid,
            "started_at": started, "ended_at": ended, "updated_at": now, "exit_reason": reason, "failure": failure,
            "hosts": ["localhost"], "processes": procs, "metrics": metrics,
            "learner_ranks": {"0": {"rank": 0, "learner/updates": steps // 20}}}


def time_cmd(cmd: list[str], env: dict, reps: int) -> tuple[list[float], subprocess.CompletedProcess]:
    """Wall seconds of `reps` invocations after one untimed warm-up (whose result is returned for checks)."""
    first = _run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=H.REPO)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=H.REPO)
        times.append(time.perf_counter() - t0)
    return times, first


def imports_on(args: list[str], env: dict) -> dict:
    """sys.modules after running the CLI with args in a child python."""
    r = _run([sys.executable, "-c", CHILD, json.dumps(args), json.dumps(list(HEAVY))], env=env,
             capture_output=True, text=True, cwd=H.REPO)
    if r.returncode != 0:
        raise RuntimeError(f"import check failed for {args}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def import_profile(args: list[str], env: dict, top: int = 8) -> list[tuple[float, str]]:
    """Largest cumulative times (ms) of top-level imports in `python -X importtime -m rlctl ARGS`."""
    r = _run([sys.executable, "-X", "importtime", "-m", "rlctl", *args], env=env, capture_output=True, text=True,
             cwd=H.REPO)
    rows = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2][1:]  # one space, then two more per nesting level
        if not name.startswith(" "):
            rows.append((int(parts[1]) / 1000, name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 invocations each")
    ap.add_argument("--runs", type=int, default=100, help="fake runs in the runs folder")
    ap.add_argument("--reps", type=int, default=None, help="timed invocations per command (>= 10)")
    args = ap.parse_args()
    H.children.install()  # killed or failing: no rlctl invocation outlives the bench
    reps = max(10, args.reps or (10 if args.quick else 20))
    cmd, shown = rlctl_command()
    on_path = shutil.which("rlctl")
    results = {}
    with H.TempDir() as tmp:
        runs_dir = tmp / "runs"
        ids = make_runs(runs_dir, args.runs)
        env = {**os.environ, "RLCTL_RUNS_DIR": str(runs_dir), "COLUMNS": "200"}
        print(f"cli latency bench: {shown}; {len(ids)} runs in {runs_dir}; {reps} timed invocations each "
              f"(+1 warm-up); {os.cpu_count()} CPUs (shared)")
        for label, cli_args in (("help", ["--help"]), ("status", ["status"])):
            times, first = time_cmd([*cmd, *cli_args], env, reps)
            if first.returncode != 0:
                raise RuntimeError(f"rlctl {' '.join(cli_args)} exited {first.returncode}: {first.stderr[-2000:]}")
            listed = sum(1 for i in ids if i in first.stdout) if label == "status" else None
            mods = imports_on(cli_args, env)
            results[label] = {"median": H.median(times), "min": min(times), "max": max(times),
                              "p90": H.percentile(times, 90), "modules": mods["modules"], "listed": listed}
            r = results[label]
            imported = [m for m, v in r["modules"].items() if v]
            print(f"  rlctl {' '.join(cli_args):8s}: median {r['median']:.3f} s (min {r['min']:.3f}, p90 {r['p90']:.3f}, "
                  f"max {r['max']:.3f})  target <= {TARGET_S} s: "
                  f"{H.verdict(r['median'], TARGET_S, higher_is_better=False)}"
                  + (f"; listed {listed}/{len(ids)} runs" if listed is not None else ""))
            print(f"      imported: {', '.join(imported) or 'none of ' + '/'.join(HEAVY)}; "
                  f"torch {'IMPORTED' if r['modules']['torch'] else 'not imported'}, "
                  f"numpy {'imported' if r['modules']['numpy'] else 'not imported'}, "
                  f"matplotlib {'imported' if r['modules']['matplotlib'] else 'not imported'}, "
                  f"pydantic {'imported' if r['modules']['pydantic'] else 'not imported'}")
            if not r["median"] <= TARGET_S or any(r["modules"][m] for m in ("torch", "numpy", "matplotlib", "pydantic")):
                print("      largest top-level imports (python -X importtime, cumulative ms):")
                for ms, name in import_profile(cli_args, env):
                    print(f"        {ms:8.1f}  {name}")
        if on_path and Path(on_path).resolve() != Path(cmd[0]).resolve():
            t_path, _ = time_cmd([on_path, "--help"], env, 5)
            print(f"  (for reference: `rlctl --help` through {on_path} on PATH takes {H.median(t_path):.3f} s; "
                  f"the difference is that wrapper's own start-up, not rlctl's)")
        t_py, _ = time_cmd([sys.executable, "-c", "pass"], env, 5)
        print(f"  (bare `python -c pass`: {H.median(t_py):.3f} s on this machine now)")
    torch_any = any(r["modules"]["torch"] for r in results.values())
    H.emit_json({"bench": "cli_latency", "help_s": round(results["help"]["median"], 4),
                 "status_s": round(results["status"]["median"], 4), "torch_imported": torch_any,
                 "numpy_imported": any(r["modules"]["numpy"] for r in results.values()),
                 "matplotlib_imported": any(r["modules"]["matplotlib"] for r in results.values()),
                 "pydantic_imported": any(r["modules"]["pydantic"] for r in results.values())})


if __name__ == "__main__":
    main()
