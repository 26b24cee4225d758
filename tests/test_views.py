"""What users look at while and after a run, on real runs: the bottleneck line and the stop progress of
`rlctl status`."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import needs_extra, only_run, read_state, run_cli, wait_for
from jobfiles import shipped_job

pytestmark = pytest.mark.slow  # end-to-end: real jobs run to their target, faults, or a lab of hosts


def _job(tmp_path, base: str, name: str, stop: str, **replace: str):
    return shipped_job(tmp_path, base.removesuffix(".toml"), stop=stop, file_name=f"{name}.toml", **replace)


def _start(tmp_path, job):
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--detach", "--runs-dir", str(runs)], timeout=60)
    return runs, only_run(runs)


def _status(runs, run_dir) -> str:
    return run_cli(["status", run_dir.name, "--runs-dir", str(runs)]).stdout


@needs_extra("video", "moviepy", "pygame")
@needs_extra("atari", "cv2")
def test_collector_bound_verdict_and_the_progress_bar_reaching_100_percent_when_the_run_stops(tmp_path):
    """One collector stepping one CartPole env cannot keep a small IMPALA learner busy: the learner waits for
    rollouts. The run stops on env steps, whose bar shows 100% then and only then."""
    job = _job(tmp_path, "impala.toml", "collector-bound", "env_steps = 12000\nwall_s = 240", envs_per_collector="1",
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
    assert re.search(r"return [\d.]+ [▁▂▃▄▅▆▇█]{3,} ", out), out  # the sparkline of the recent mean returns
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
    """An APPO learner making 10 epochs over every batch of a 512 x 512 model cannot take the rollouts of 16 envs
    as fast as they come: the collector waits for the learner's socket about 90% of its time on 2 cores.

    (A one-pass IMPALA learner of the same kind is only about 1.3 times slower than its collector here, so the
    collector waited 15-30% and the verdict flipped between learner-bound and balanced.)"""
    job = _job(tmp_path, "appo.toml", "learner-bound", "wall_s = 120", envs_per_collector="16", collectors="1",
               batch_steps="512", hidden="[512, 512]")
    runs, run_dir = _start(tmp_path, job)
    try:
        found = wait_for(lambda: re.search(r"learner-bound: collectors wait (\d+)% for the learner; learner waits "
                                           r"(\d+)%", _status(runs, run_dir)), 100, interval=0.5,
                         what="the learner-bound verdict in rlctl status")
        assert int(found.group(1)) >= 25 and int(found.group(2)) < int(found.group(1)), found.group(0)
    finally:
        run_cli(["stop", run_dir.name, "--runs-dir", str(runs)], timeout=90)


def test_compare_shows_only_the_keys_that_differ_and_time_to_target(tmp_path):
    from rlctl.rundir import RunDir
    from rlctl.job.load import validate_job
    from rlctl.job.resolved import resolved_dict
    from rlctl.job.toml_writer import dumps_toml

    runs = tmp_path / "runs"
    made = []
    for lr, envs, reason, steps in ((1e-3, 8, "eval/return_mean 480.0 >= 475", 120_000),
                                    (3e-4, 16, "wall time 600s >= 600s", 900_000)):
        rd = RunDir.create(runs, "apex-cartpole")
        job = validate_job({"job": {"name": "apex-cartpole", "stop": {"eval_return": 475.0, "wall_s": 600}},
                            "env": {"id": "CartPole-v1", "envs_per_collector": envs},
                            "algorithm": {"name": "apex", "lr": lr}})
        rd.job_toml.write_text(dumps_toml(resolved_dict(job)))
        rd.write_state({"run_id": rd.run_id, "job": "apex-cartpole", "algorithm": "apex", "status": "finished",
                        "started_at": 1000.0, "ended_at": 1000.0 + steps / 1000, "exit_reason": reason,
                        "metrics": {"charts/env_steps": steps, "charts/episode_return_mean": 300.5,
                                    "eval/return_mean": 480.0}})
        made.append(rd)
        time.sleep(1.05)
    a, b = (rd.run_id for rd in made)
    table = run_cli(["compare", a, b, "--runs-dir", str(runs)], env={"COLUMNS": "200"}).stdout
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line.strip() and "─" not in line}
    assert rows["algorithm.lr"] == ["0.001", "0.0003"] and rows["env.envs_per_collector"] == ["8", "16"]
    assert "algorithm.gamma" not in rows and "job.name" not in rows  # the same in both
    data = json.loads(run_cli(["compare", a, b, "--json", "--runs-dir", str(runs)]).stdout)
    assert data[a]["time_to_target_s"] == 120.0 and data[a]["env_steps_to_target"] == 120_000
    assert data[b]["time_to_target_s"] is None and data[b]["exit_reason"] == "wall time 600s >= 600s"
    assert data[a]["job"] == {"algorithm.lr": 0.001, "env.envs_per_collector": 8} and data[b]["env_steps"] == 900_000
    assert rows["time"] == ["to", "target", "2m00s", "not", "reached"]


def _wandb_records(path):
    """The records of an offline W&B run file (its LevelDB-style log of Record protos, 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, out, part = path.read_bytes(), 7, [], b""  # 7: the ":W&B" header, magic and version
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            out.append(record)
    return out


@needs_extra("wandb", "wandb")
def test_wandb_offline_mirrors_the_scalars_and_the_job(tmp_path):
    job = shipped_job(tmp_path, "ppo", stop="env_steps = 40000", wall_s=120,
                      extra='\n[logging.wandb]\nproject = "rlctl-test"\nmode = "offline"\n')
    runs = tmp_path / "runs"
    run_cli(["run", str(job), "--runs-dir", str(runs)], timeout=240)
    run_dir = only_run(runs)
    assert read_state(run_dir)["status"] == "finished"
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list(run_dir.rglob("*"))
    records = _wandb_records(files[0])
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]
    config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for r in records
              if r.WhichOneof("record_type") == "run" for i in r.run.config.update}
    steps = [h["charts/env_steps"] for h in history if "charts/env_steps" in h]
    assert len(steps) >= 3 and steps == sorted(steps) and steps[-1] >= 40000, steps
    assert all(h["_step"] == h["charts/env_steps"] for h in history if "charts/env_steps" in h)
    assert any("charts/episode_return_mean" in h for h in history)
    assert config["algorithm.name"] == "ppo" and config["env.id"] == "CartPole-v1"
    # Nothing of W&B's is left running after the run.
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).find(str(run_dir)) >= 0]
    assert not left, [_cmdline(p) for p in left]


def _cmdline(p) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
