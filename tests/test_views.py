"""What users look at while and after a run, on real runs: the bottleneck line and the stop progress of
`rlctl status`."""

from __future__ import annotations

import json
import re

from conftest import REPO, only_run, read_state, run_cli, wait_for


def _impala(tmp_path, name: str, stop: str, **replace: str):
    text = (REPO / "jobs" / "impala.toml").read_text()
    text = re.sub(r"(?ms)^\[job\.stop\]\n.*?(?=^\[)", f"[job.stop]\n{stop}\n\n", text)
    for key, value in replace.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, key
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _start(tmp_path, job):
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--detach", "--runs-dir", str(runs)], timeout=60)
    return runs, only_run(runs)


def _status(runs, run_dir) -> str:
    return run_cli(["status", run_dir.name, "--runs-dir", str(runs)]).stdout


def test_collector_bound_verdict_and_the_progress_bar_reaching_100_percent_when_the_run_stops(tmp_path):
    """One collector stepping one CartPole env cannot keep a small IMPALA learner busy: the learner waits for
    rollouts. The run stops on env steps, whose bar shows 100% then and only then."""
    job = _impala(tmp_path, "collector-bound", "env_steps = 12000\nwall_s = 240", envs_per_collector="1",
                  collectors="1", batch_steps="32")
    runs, run_dir = _start(tmp_path, job)
    seen = []

    def verdict():
        out = _status(runs, run_dir)
        bar = re.search(r"env steps\s.*?(\d+)% ([\d,]+) / 12,000", out)
        if bar and read_state(run_dir).get("status") == "running":
            seen.append(int(bar.group(1)))
        return re.search(r"^.*collector-bound: learner waits (\d+)% for rollouts; collectors wait (\d+)%.*$", out,
                         re.M)
    found = wait_for(verdict, 120, interval=0.5, what="the collector-bound verdict in rlctl status")
    assert int(found.group(1)) >= 25 and int(found.group(2)) < int(found.group(1)), found.group(0)
    state = wait_for(lambda: (st := read_state(run_dir)).get("status") in ("finished", "failed") and st, 240,
                     what="the run to end")
    assert state["status"] == "finished" and state["exit_reason"].startswith("charts/env_steps"), state
    assert seen and all(p < 100 for p in seen), seen  # while it ran
    out = _status(runs, run_dir)
    assert re.search(r"env steps\s.*100% [\d,]+ / 12,000", out), out
    assert "bound:" not in out  # a verdict is about a running job
    _check_hparams(run_dir)
    _check_video(tmp_path, runs, run_dir)


def _check_video(tmp_path, runs, run_dir):
    """`rlctl eval --video`: one MP4 per episode, as many frames as the episode has steps, and the returns table
    as JSON."""
    import cv2

    out = run_cli(["eval", run_dir.name, "--runs-dir", str(runs), "--episodes", "2", "--seed", "7", "--video",
                   str(tmp_path / "videos"), "--json"], timeout=180)
    result = json.loads(out.stdout)
    assert len(result["returns"]) == len(result["lengths"]) == len(result["videos"]) == 2
    assert result["return_mean"] == sum(result["returns"]) / 2
    for video, length in zip(result["videos"], result["lengths"]):
        capture = cv2.VideoCapture(video)
        frames, width = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        ok, first = capture.read()
        capture.release()
        assert ok and first.std() > 0 and width == 600  # CartPole's 600 x 400 rgb_array, not a blank frame
        assert frames in (length, length + 1), (video, frames, length)  # every step (and the reset) rendered


def _check_hparams(run_dir):
    """The run's HParams entry, read back through tensorboard's own reader and the hparams plugin's protos."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    content = {tag: plugin_data_pb2.HParamsPluginData.FromString(data)
               for tag, data in acc.PluginTagToContent("hparams").items()}
    experiment = content["_hparams_/experiment"].experiment
    names = {h.name: h.type for h in experiment.hparam_infos}
    assert names["algorithm.lr"] == api_pb2.DATA_TYPE_FLOAT64 and names["env.id"] == api_pb2.DATA_TYPE_STRING
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"charts/episode_return_mean", "charts/env_steps"} <= metrics
    assert metrics <= set(acc.Tags()["scalars"]) | {"eval/return_mean"}  # each metric's last value is a figure
    start = content["_hparams_/session_start_info"].session_start_info
    assert start.hparams["algorithm.lr"].number_value == 1e-3
    assert start.hparams["env.envs_per_collector"].number_value == 1
    assert start.hparams["model.hidden"].string_value == "[64, 64]"
    assert content["_hparams_/session_end_info"].session_end_info.status == api_pb2.STATUS_SUCCESS


def test_learner_bound_verdict(tmp_path):
    """A 1024 x 1024 IMPALA learner on 2 cores cannot take the rollouts of 16 envs as fast as they come:
    the collector waits for the learner's socket."""
    job = _impala(tmp_path, "learner-bound", "wall_s = 120", envs_per_collector="16", collectors="1",
                  batch_steps="512", hidden="[1024, 1024]")
    runs, run_dir = _start(tmp_path, job)
    try:
        found = wait_for(lambda: re.search(r"learner-bound: collectors wait (\d+)% for the learner; learner waits "
                                           r"(\d+)%", _status(runs, run_dir)), 100, interval=0.5,
                         what="the learner-bound verdict in rlctl status")
        assert int(found.group(1)) >= 25 and int(found.group(2)) < int(found.group(1)), found.group(0)
    finally:
        run_cli(["stop", run_dir.name, "--runs-dir", str(runs)], timeout=90)
