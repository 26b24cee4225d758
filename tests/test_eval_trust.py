"""`rlctl eval` and untrusted checkpoints (issue 13).

A checkpoint file is data from wherever it came from: `eval` of a bare `.pt` never imports or calls code its stored
job names (`module:attr` env ids, wrappers, ...) unless the user says so (`--trust-checkpoint`), or the job comes
from somewhere the user owns (the run directory's job.toml, `--job FILE`). A malformed checkpoint exits 2 with one
line naming the file and the reason, never a traceback.

The entry points here live in `evilmod`, a module the tests write whose import leaves a marker file: the marker
tells whether `eval` imported it.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from rlctl.algos import build_model
from rlctl.checkpoint import FORMAT
from rlctl.envs import SpaceInfo
from rlctl.job.load import validate_job
from rlctl.job.resolved import resolved_dict
from rlctl.job.toml_writer import dumps_toml

CARTPOLE = SpaceInfo((4,), "float32", n_actions=2)

EVILMOD = """
import pathlib

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

pathlib.Path({marker!r}).write_text("imported")


def make(**kwargs):
    return CartPoleEnv(**kwargs)


class Wrap(gym.Wrapper):
    pass
"""


@pytest.fixture
def evil(tmp_path) -> tuple[dict, Path]:
    """(extra environment for run_cli that puts `evilmod` on the path, the marker its import writes)."""
    marker = tmp_path / "evilmod-was-imported"
    (tmp_path / "evilmod.py").write_text(EVILMOD.format(marker=str(marker)))
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}, marker


def _job(env_id: str = "CartPole-v1", **env) -> dict:
    return {"job": {"name": "trust"}, "algorithm": {"name": "apex"}, "topology": {"collectors": 1},
            "env": {"id": env_id, "envs_per_collector": 1, "max_episode_steps": 50, **env}}


def _checkpoint(path: Path, with_job: dict | None = None, for_space: SpaceInfo = CARTPOLE,
                weights_for: SpaceInfo | None = None, **changes) -> Path:
    """A checkpoint as the learner writes one (format marker, resolved job, space, weights), with `changes` applied
    (a value of None drops the key)."""
    spec = validate_job(with_job or _job())
    model = build_model(spec, weights_for or for_space)
    payload = {"format": FORMAT, "algorithm": spec.algorithm.name, "job": resolved_dict(spec),
               "space": for_space.to_dict(), "model": model.state_dict(), "updates": 7}
    payload.update(changes)
    torch.save({k: v for k, v in payload.items() if v is not None}, path)
    return path


def _one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


REFUSED_JOBS = {
    "env-entry-point": _job("evilmod:make"),
    "wrapper": _job(wrappers=["evilmod:Wrap"]),
    "wrapper-with-kwargs": _job(wrappers=[{"name": "evilmod:Wrap", "kwargs": {}}]),
    # gymnasium's compatibility envs make another library's env by the name in their kwargs ("module:Env" imports).
    "compat-env": _job("GymV26Environment-v0", kwargs={"env_id": "evilmod:Thing-v0"}),
    # passed by gymnasium to the vector env itself (AsyncVectorEnv takes a `worker` callable), not to the env.
    "vector-kwargs": _job(kwargs={"vector_kwargs": {"shared_memory": False}}),
}


@pytest.mark.parametrize("case", list(REFUSED_JOBS))
def test_bare_checkpoint_naming_code_is_refused(tmp_path, evil, case):
    env, marker = evil
    ckpt = _checkpoint(tmp_path / "downloaded.pt", REFUSED_JOBS[case])
    proc = run_cli(["eval", str(ckpt), "--episodes", "2"], expected_exit=2, env=env)
    line = _one_line_error(proc)
    assert line.startswith(str(ckpt)) and "--trust-checkpoint" in line and "--job" in line, line
    assert not marker.exists()


def test_bare_checkpoint_of_a_registered_env_evaluates(tmp_path, evil):
    # The refusal is not of bare checkpoints as such: a registered id with rlctl's own wrapper is made as before.
    env, marker = evil
    ckpt = _checkpoint(tmp_path / "downloaded.pt", _job(wrappers=["rlctl.envs:MaskVelocity"]),
                       for_space=SpaceInfo((2,), "float32", n_actions=2))
    result = json.loads(run_cli(["eval", str(ckpt), "--episodes", "2", "--json"], env=env).stdout)
    assert result["episodes"] == 2 and result["updates"] == 7
    # ...and the same checkpoint naming a module is refused (this is what fails without the trust rule).
    _checkpoint(ckpt, _job("evilmod:make"))
    run_cli(["eval", str(ckpt), "--episodes", "2"], expected_exit=2, env=env)
    assert not marker.exists()


@pytest.mark.parametrize("case", ["env-entry-point", "wrapper"])
def test_trust_checkpoint_allows_the_code_it_names(tmp_path, evil, case):
    # Proves the refusal tests can fail: with trust, the very same checkpoint imports evilmod and evaluates.
    env, marker = evil
    ckpt = _checkpoint(tmp_path / "downloaded.pt", REFUSED_JOBS[case])
    result = json.loads(run_cli(["eval", str(ckpt), "--episodes", "2", "--json", "--trust-checkpoint"],
                                env=env).stdout)
    assert result["episodes"] == 2
    assert marker.exists()


def _run_dir(runs: Path, run_id: str, job_toml: dict, checkpoint_job: dict) -> Path:
    d = runs / run_id
    (d / "checkpoints").mkdir(parents=True)
    (d / "job.toml").write_text(dumps_toml(resolved_dict(validate_job(job_toml))))
    (d / "state.json").write_text(json.dumps({"run_id": run_id, "status": "finished"}))
    _checkpoint(d / "checkpoints" / "best.pt", checkpoint_job)
    return d


def test_a_run_is_evaluated_with_its_own_job_toml(tmp_path, evil):
    env, marker = evil
    runs = tmp_path / "runs"
    # The run's job.toml is the user's: its env is made, not the one a (replaced) checkpoint names.
    _run_dir(runs, "mine-20240101-000000", _job(), _job("evilmod:make"))
    result = json.loads(run_cli(["eval", "mine", "--episodes", "2", "--json", "--runs-dir", str(runs)],
                                env=env).stdout)
    assert result["episodes"] == 2
    assert not marker.exists()
    # ...and the entry points a run's own job.toml names are the user's code: allowed.
    _run_dir(runs, "custom-20240101-000000", _job("evilmod:make"), _job("evilmod:make"))
    run_cli(["eval", "custom", "--episodes", "2", "--runs-dir", str(runs)], env=env)
    assert marker.exists()


def test_job_file_replaces_the_checkpoints_job(tmp_path, evil):
    env, marker = evil
    mine = tmp_path / "mine.toml"
    mine.write_text(dumps_toml(resolved_dict(validate_job(_job()))))
    ckpt = _checkpoint(tmp_path / "downloaded.pt", _job("evilmod:make"))
    result = json.loads(run_cli(["eval", str(ckpt), "--job", str(mine), "--episodes", "2", "--json"],
                                env=env).stdout)
    assert result["episodes"] == 2
    assert not marker.exists()
    # A job file's entry points are the user's choice: allowed.
    custom = tmp_path / "custom.toml"
    custom.write_text(dumps_toml(resolved_dict(validate_job(_job("evilmod:make")))))
    run_cli(["eval", str(_checkpoint(ckpt)), "--job", str(custom), "--episodes", "2"], env=env)
    assert marker.exists()


def _truncated(path: Path) -> None:
    _checkpoint(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


MALFORMED = {
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncated,
    "random-bytes": lambda p: p.write_bytes(bytes(range(256)) * 40),
    "pickled-code": lambda p: torch.save({"format": FORMAT, "job": Path("x")}, p),
    "not-a-dict": lambda p: torch.save([1, 2, 3], p),
    "no-format": lambda p: _checkpoint(p, format=None),
    "no-job": lambda p: _checkpoint(p, job=None),
    "no-model": lambda p: _checkpoint(p, model=None),
    "no-space": lambda p: _checkpoint(p, space=None),
    "job-not-a-dict": lambda p: _checkpoint(p, job=["CartPole-v1"]),
    "invalid-job": lambda p: _checkpoint(p, job={"job": {"name": "x"}, "env": {"id": ""},
                                                          "algorithm": {"name": "nope"}}),
    "bad-space": lambda p: _checkpoint(p, space={"obs_shape": 4}),
    "weights-wrong-shape": lambda p: _checkpoint(p, weights_for=SpaceInfo((6,), "float32", n_actions=3)),
    "weights-not-tensors": lambda p: _checkpoint(p, model={"anything": 1}),
    "model-not-a-dict": lambda p: _checkpoint(p, model=[1, 2]),
    "space-not-the-envs": lambda p: _checkpoint(p, for_space=SpaceInfo((6,), "float32", n_actions=2)),
    "bad-updates": lambda p: _checkpoint(p, updates="many"),
    "space-of-12m-floats": lambda p: _checkpoint(p, space=SpaceInfo((12_000_000,), "float32", n_actions=2).to_dict()),
    "job-of-a-huge-network": lambda p: _checkpoint(p, job=resolved_dict(validate_job(
        {**_job(), "model": {"hidden": [65536] * 16}}))),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_is_refused_with_a_one_line_reason(tmp_path, case):
    """Every malformed case, in this process: a CheckpointError whose reason is one line (what `rlctl eval` prints
    after the file's name, exiting 2: the test below runs the command itself for some of them)."""
    from rlctl.checkpoint import CheckpointError, evaluate_checkpoint

    ckpt = tmp_path / "broken.pt"
    MALFORMED[case](ckpt)
    with pytest.raises(CheckpointError) as refused:
        evaluate_checkpoint(ckpt, episodes=2, seed=0)
    reason = str(refused.value)
    assert len(reason) > 10 and "\n" not in reason and "Traceback" not in reason, reason


@pytest.mark.parametrize("case", ["truncated", "pickled-code", "weights-wrong-shape", "job-of-a-huge-network"])
def test_malformed_checkpoint_exits_2_with_one_line(tmp_path, case):
    ckpt = tmp_path / "broken.pt"
    MALFORMED[case](ckpt)
    proc = run_cli(["eval", str(ckpt), "--episodes", "2"], expected_exit=2)
    line = _one_line_error(proc)
    assert line.startswith(f"{ckpt}: ") and len(line) > len(f"{ckpt}: ") + 10, line


HUGE = {
    # An 18 KB file whose space record declares 12M floats of observation (a network of 3 GB for it).
    "space": lambda p: _checkpoint(p, space=SpaceInfo((12_000_000,), "float32", n_actions=2).to_dict()),
    # A stored job whose network has 16 layers of 65536 units (68G parameters); the weights are CartPole's small ones.
    "network": lambda p: _checkpoint(p, job=resolved_dict(validate_job({**_job(), "model": {"hidden": [65536] * 16}}))),
}
MEASURE_REFUSAL = """
import json, resource, sys, time
import torch, gymnasium
from rlctl.checkpoint import CheckpointError, evaluate_checkpoint
before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
try:
    evaluate_checkpoint(sys.argv[1], episodes=2, seed=0)
    reason = None
except CheckpointError as exc:
    reason = str(exc)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"reason": reason, "seconds": time.monotonic() - start, "grown_mb": grown / 1024}))
"""


@pytest.mark.parametrize("case", list(HUGE))
def test_a_checkpoint_declaring_a_huge_network_is_refused_before_it_is_built(tmp_path, case):
    """Issue 28 (6): the file's declared shapes are checked against the env's own spaces and the weights it holds
    before anything is allocated for them: refused in under 2 s, the process growing by under 200 MB."""
    ckpt = HUGE[case](tmp_path / "huge.pt")
    assert ckpt.stat().st_size < 100_000
    proc = subprocess.run([sys.executable, "-c", MEASURE_REFUSAL, str(ckpt)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["reason"] is not None, result
    assert result["seconds"] < 2.0 and result["grown_mb"] < 200, result


# What `rlctl eval` prints (issue 30): mean ± std, sampled episodes with --stochastic, videos named by episode, no
# stray stderr, a progress line while episodes run.

def _ppo_job() -> dict:
    return {**_job(), "algorithm": {"name": "ppo"}}


def test_eval_summary_has_mean_and_std_and_stochastic_samples_a_policy(tmp_path):
    import numpy as np

    greedy = run_cli(["eval", str(_checkpoint(tmp_path / "ppo.pt", _ppo_job())), "--episodes", "4"])
    summary = rf"{tmp_path}/ppo.pt: mean return [\d.]+ ± [\d.]+ over 4 greedy episodes \(min [\d.]+, max [\d.]+\)$"
    assert greedy.stderr == "" and re.match(summary, greedy.stdout.splitlines()[0]), greedy.stdout

    def sampled(seed: str) -> dict:
        return json.loads(run_cli(["eval", str(tmp_path / "ppo.pt"), "--episodes", "6", "--stochastic", "--json",
                                   "--seed", seed]).stdout)
    first, again = sampled("5"), sampled("5")
    assert first["stochastic"] and first["returns"] == again["returns"]  # sampled, and repeatable with the seed
    assert first["return_std"] == pytest.approx(float(np.std(first["returns"])))
    refused = run_cli(["eval", str(_checkpoint(tmp_path / "apex.pt")), "--stochastic"], expected_exit=2)
    assert "--stochastic samples a policy network's actions" in _one_line_error(refused)


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("moviepy", "pygame")),
                    reason="needs the [video] extra: pip install -e '.[video]'")
def test_eval_videos_are_named_by_episode_and_leave_stderr_empty(tmp_path):
    videos = tmp_path / "videos"
    ckpt = _checkpoint(tmp_path / "apex.pt")
    for _ in range(2):  # the second time into a folder that has them already
        # An XDG_RUNTIME_DIR that is no folder made SDL (pygame's, drawing CartPole) complain on stderr.
        proc = run_cli(["eval", str(ckpt), "--episodes", "3", "--video", str(videos)],
                       env={"XDG_RUNTIME_DIR": str(tmp_path / "nowhere")})
        # Nothing but eval's own progress lines, which a slow first frame (a cold machine's first encoder start
        # took over 5 s for 3 steps) rightly brings out.
        assert all(re.fullmatch(r"eval: \d/3 episodes done, [\d,]+ env steps, [\d.]+s", line)
                   for line in proc.stderr.splitlines()), proc.stderr
        assert sorted(p.name for p in videos.iterdir()) == ["episode-0.mp4", "episode-1.mp4", "episode-2.mp4"]
        assert [line.rsplit(", ", 1)[-1] for line in proc.stdout.splitlines()[1:]] == [
            str(videos / f"episode-{i}.mp4") for i in range(3)], proc.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_eval_progress_line_is_rewritten_on_a_terminal_and_erased_at_the_end():
    from rlctl.views.eval_progress import EpisodeProgress

    terminal = _Terminal()
    progress = EpisodeProgress(10, terminal)
    progress(0, 5)  # within its first tenth of a second: nothing yet
    assert terminal.getvalue() == ""
    progress.next_at = 0.0
    progress(3, 1234)
    assert re.fullmatch(r"\reval: 3/10 episodes done, 1,234 env steps, \d+\.\ds", terminal.getvalue())
    progress.next_at = 0.0
    progress(10, 2000)  # all done: the results follow
    shown = terminal.getvalue()
    progress.close()
    assert terminal.getvalue() == shown + "\r" + " " * (len(shown) - 1) + "\r"
    piped = io.StringIO()
    plain = EpisodeProgress(10, piped)
    plain(3, 1234)  # a pipe gets a line every 5 s at most: none for a short evaluation
    plain.next_at = 0.0
    plain(4, 1500)
    plain.close()
    assert re.fullmatch(r"eval: 4/10 episodes done, 1,500 env steps, \d+\.\ds\n", piped.getvalue())
