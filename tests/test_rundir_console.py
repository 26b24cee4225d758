"""Tests for rlctl.rundir (run directories, state, logs) and rlctl.views.console (formatting)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, start_cli
from rlctl import liveness, run_logs, rundir
from rlctl.views import compare_view, console, log_view
from rlctl.rundir import RunDir, RunNotFound

OWN_START = liveness.process_start_time(os.getpid())  # with the pid: a supervisor alive as recorded

REPO_ROOT = Path(__file__).resolve().parents[1]
T0 = 1_764_453_671.0  # a fixed epoch time for reproducible log timestamps


def stamp(ts: float) -> str:
    """Timestamp prefix as the supervisor writes it (local ISO-8601 with milliseconds)."""
    return datetime.fromtimestamp(ts).isoformat(timespec="milliseconds")


def write_log(run: RunDir, name: str, lines: list[tuple[float, str]], mode: str = "w") -> Path:
    path = run.logs_dir / f"{name}.log"
    with open(path, mode, encoding="utf-8") as f:
        for ts, text in lines:
            f.write(f"{stamp(ts)} {text}\n")
    return path


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid no longer exists
    return proc.pid


def make_run(root: Path, job: str = "apex-cartpole", **state) -> RunDir:
    run = RunDir.create(root, job)
    base = {"run_id": run.run_id, "job": job, "algorithm": "apex", "status": "running",
            "supervisor_pid": os.getpid(), "supervisor_start": OWN_START, "started_at": time.time()}
    run.write_state({**base, **state})
    return run


def wait_until(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


# ---------------------------------------------------------------- rundir


def test_runs_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("RLCTL_RUNS_DIR", raising=False)
    assert rundir.runs_root() == Path("runs")
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(tmp_path / "env"))
    assert rundir.runs_root() == tmp_path / "env"
    assert rundir.runs_root(tmp_path / "arg") == tmp_path / "arg"


def test_new_run_id_format():
    run_id = rundir.new_run_id("apex cartpole/v1", now=T0)
    assert run_id == "apex-cartpole-v1-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(T0))


def test_create_gives_unique_ids_in_same_second(tmp_path):
    runs = [RunDir.create(tmp_path, "job", now=T0) for _ in range(3)]
    ids = [r.run_id for r in runs]
    assert len(set(ids)) == 3
    assert ids[1] == ids[0] + "-2" and ids[2] == ids[0] + "-3"
    for r in runs:
        assert r.logs_dir.is_dir() and r.tb_dir.is_dir() and r.checkpoints_dir.is_dir()


def test_state_round_trip_is_atomic(tmp_path):
    run = RunDir.create(tmp_path, "job")
    assert run.read_state() is None
    state = {"status": "running", "metrics": {"charts/env_steps": 5}, "ended_at": None}
    run.write_state(state)
    assert run.read_state() == state
    assert sorted(p.name for p in run.path.iterdir()) == ["checkpoints", "logs", "state.json", "tb"]
    compact = '{"status":"running","metrics":{"charts/env_steps":5},"ended_at":null}\n'
    assert run.state_json.read_text() == compact


def test_corrupt_state_reads_as_none(tmp_path):
    run = RunDir.create(tmp_path, "job")
    run.state_json.write_text('{"status": "runn')
    assert run.read_state() is None
    assert run.effective_status() == "unknown"
    run.state_json.write_text("[1, 2]")
    assert run.read_state() is None


def test_effective_status_detects_lost(tmp_path):
    run = RunDir.create(tmp_path, "job")
    run.write_state({"status": "running", "supervisor_pid": os.getpid(), "supervisor_start": OWN_START})
    assert run.effective_status() == "running"
    run.write_state({"status": "running", "supervisor_pid": os.getpid()})
    assert run.effective_status() == "lost"  # no start time: nothing says the pid is still the supervisor
    run.write_state({"status": "running", "supervisor_pid": dead_pid()})
    assert run.effective_status() == "lost"
    run.write_state({"status": "finished", "supervisor_pid": dead_pid()})
    assert run.effective_status() == "finished"
    assert liveness.pid_alive(os.getpid()) and not liveness.pid_alive(None)


def test_resolve_run_newest_prefix_and_not_found(tmp_path):
    old = make_run(tmp_path, "alpha", started_at=T0)
    new = make_run(tmp_path, "beta", started_at=T0 + 10)
    RunDir.create(tmp_path, "no-state")  # no state.json / plan.json: not a run
    assert [r.run_id for r in rundir.list_runs(tmp_path)] == [old.run_id, new.run_id]
    assert rundir.resolve_run(tmp_path, None) == new
    assert rundir.resolve_run(tmp_path, old.run_id) == old
    assert rundir.resolve_run(tmp_path, "alp") == old
    with pytest.raises(RunNotFound) as err:
        rundir.resolve_run(tmp_path, "gamma")
    assert "gamma" in str(err.value) and new.run_id in str(err.value)
    make_run(tmp_path, "alpha", started_at=T0 + 20)
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        rundir.resolve_run(tmp_path, "alpha")
    with pytest.raises(RunNotFound, match="no runs"):
        rundir.resolve_run(tmp_path / "empty", None)


def test_parse_log_line():
    ts, text = run_logs.parse_log_line(f"{stamp(T0 + 0.123)} hello world\n")
    assert ts == pytest.approx(T0 + 0.123) and text == "hello world"
    assert run_logs.parse_log_line("2026-11-29 not a stamp") == (None, "2026-11-29 not a stamp")
    assert run_logs.parse_log_line("no stamp") == (None, "no stamp")


def test_log_files_filters(tmp_path):
    run = RunDir.create(tmp_path, "job")
    for name in ("learner-0", "collector-1", "collector-0", "replay-buffer-0"):
        write_log(run, name, [])
    assert [p.stem for p in run.log_files()] == ["collector-0", "collector-1", "learner-0", "replay-buffer-0"]
    assert [p.stem for p in run.log_files(role="collector")] == ["collector-0", "collector-1"]
    assert [p.stem for p in run.log_files(role="collector", rank=1)] == ["collector-1"]
    assert [p.stem for p in run.log_files(role="replay-buffer")] == ["replay-buffer-0"]


def test_merged_log_lines_orders_across_files_and_tails(tmp_path):
    run = RunDir.create(tmp_path, "job")
    write_log(run, "collector-0", [(T0 + 1, "c1"), (T0 + 3, "c3"), (T0 + 5, "c5")])
    path = write_log(run, "learner-0", [(T0 + 2, "l2"), (T0 + 4, "l4")])
    with open(path, "a") as f:
        f.write("continuation without stamp\n")
    merged = run_logs.merged_log_lines(run)
    assert [text for _, _, text in merged] == ["c1", "l2", "c3", "l4", "continuation without stamp", "c5"]
    assert merged[4][0] == pytest.approx(T0 + 4)  # took the previous line's timestamp
    assert merged[1][1] == "learner-0"
    assert [t for _, _, t in run_logs.merged_log_lines(run, tail=2)] == ["continuation without stamp", "c5"]
    assert [t for _, _, t in run_logs.merged_log_lines(run, role="learner")] == ["l2", "l4", "continuation without stamp"]
    assert run_logs.merged_log_lines(run, tail=0) == []


def _follow_in_thread(run: RunDir, **kwargs):
    got: list = []

    def consume():
        for entry in run_logs.follow_logs(run, poll_s=0.02, **kwargs):
            got.append(entry)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return got, thread


def test_follow_logs_new_file_partial_writes_and_termination(tmp_path):
    run = make_run(tmp_path)
    write_log(run, "collector-0", [(T0, "old line")])
    got, thread = _follow_in_thread(run)
    assert wait_until(lambda: len(got) == 1)
    learner = run.logs_dir / "learner-0.log"
    with open(learner, "w") as f:  # a process that started later
        f.write(f"{stamp(T0 + 1)} hel")
        f.flush()
        time.sleep(0.1)  # several poll rounds see only the unfinished line
        assert len(got) == 1
        f.write("lo\n")
    assert wait_until(lambda: len(got) == 2)
    assert got[1][1:] == ("learner-0", "hello")
    write_log(run, "collector-0", [(T0 + 2, "last words")], mode="a")
    run.write_state({**run.read_state(), "status": "finished"})
    thread.join(timeout=5)
    assert not thread.is_alive()
    # The supervisor wrote no end line (a state written by hand): one is made from state.json.
    assert [t for _, _, t in got] == ["old line", "hello", "last words", "run finished after 0.0s: finished"]


def test_follow_logs_tail_and_lost_run(tmp_path):
    run = make_run(tmp_path, supervisor_pid=dead_pid(), started_at=T0, updated_at=T0 + 7)
    write_log(run, "collector-0", [(T0, "before"), (T0 + 1, "last")])
    # Lost run: reads what is there, then returns immediately with an end line saying so.
    lost = "run lost after 7.0s: its supervisor is gone"
    assert [t for _, _, t in run_logs.follow_logs(run, poll_s=0.01, tail=1)] == ["last", lost]
    assert [t for _, _, t in run_logs.follow_logs(run, poll_s=0.01, tail=0)] == [lost]
    assert [t for _, _, t in run_logs.follow_logs(run, poll_s=0.01)] == ["before", "last", lost]


def test_follow_logs_with_a_tail_misses_no_line_written_after_it(tmp_path):
    run = make_run(tmp_path)
    write_log(run, "collector-0", [(T0, "a"), (T0 + 1, "b")])
    follower = run_logs.follow_logs(run, poll_s=0.01, tail=1)
    assert next(follower)[2] == "b"  # the tail is read; the follower has not polled yet
    write_log(run, "collector-0", [(T0 + 2, "c")], mode="a")  # between the tail and the first poll
    write_log(run, "supervisor", [(T0 + 3, run_logs.end_line_text("finished", "done", 3.0))])
    run.write_state({**run.read_state(), "status": "finished"})
    assert [t for _, _, t in follower] == ["c", "run finished after 3.0s: done"]  # the supervisor's, not a second


def test_follow_logs_merges_a_round_by_time(tmp_path):
    run = make_run(tmp_path, status="stopped", started_at=T0, ended_at=T0 + 4, exit_reason="stopped by SIGTERM")
    write_log(run, "learner-0", [(T0 + 2, "l2")])
    write_log(run, "collector-0", [(T0 + 1, "c1"), (T0 + 3, "c3")])
    assert [t for _, _, t in run_logs.follow_logs(run, poll_s=0.01)] == [
        "c1", "l2", "c3", "run stopped after 4.0s: stopped by SIGTERM"]


def test_logs_json_gives_one_object_per_line_and_a_role_typo_names_the_known_roles(tmp_path):
    from conftest import run_cli

    run = make_run(tmp_path, status="finished", started_at=T0, ended_at=T0 + 3, exit_reason="done")
    write_log(run, "collector-0", [(T0 + 1, "c1 {not json}")])
    write_log(run, "supervisor", [(T0 + 3, run_logs.end_line_text("finished", "done", 3.0))])
    env = {"RLCTL_RUNS_DIR": str(tmp_path)}
    out = run_cli(["logs", run.run_id, "--json"], env=env).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == [{"ts": T0 + 1, "source": "collector-0", "text": "c1 {not json}"},
                    {"ts": T0 + 3, "source": "supervisor", "text": "run finished after 3.0s: done"}]
    assert run_cli(["logs", run.run_id, "--json", "-f"], env=env).stdout == out  # the run is over: same lines
    # People's lines are never wrapped, whatever width COLUMNS gives: one entry, one line.
    long_text = "metrics " + " ".join(f"key{i}=value{i}" for i in range(30))
    write_log(run, "learner-0", [(T0 + 2, long_text)])
    shown = run_cli(["logs", run.run_id, "--tail", "2"], env={**env, "COLUMNS": "40"}).stdout.splitlines()
    assert len(shown) == 2 and shown[0].endswith(f" learner-0 | {long_text}"), shown
    typo = run_cli(["logs", run.run_id, "--role", "colector"], expected_exit=2, env=env)
    assert typo.stdout == ""
    assert typo.stderr.strip() == ("rlctl logs: no role 'colector'; known roles: collector, evaluator, inference, "
                                   "learner, relay, replay, supervisor")


def test_metrics_line_is_compact_and_says_the_returns_of_the_episodes_since_the_last_one():
    from rlctl import metric_names as M
    from rlctl.roles.metrics_line import MetricsLine, format_line, number

    assert [number(x) for x in (12345, 4100.3, 23.46, 0.012345, 5.0, 0.0)] == ["12345", "4100", "23.5", "0.0123",
                                                                              "5", "0"]
    line = MetricsLine(10.0, now=0.0)
    beat = {M.COLLECTOR_ENV_STEPS: 12345, M.ENV_STEPS_PER_S: 4100.3, M.COLLECTOR_WAIT_FRAC: 0.12,
            M.EPISODE_RETURNS: [20.0, 27.0], M.EPISODE_LENGTHS: [20, 27], M.NET_DROPPED: 0, M.NET_REFUSED: 2}
    assert line.offer(beat, now=5.0) is None  # not due yet: its returns are kept for the line
    assert line.offer({**beat, M.EPISODE_RETURNS: [23.5]}, now=10.0) == (
        "metrics env_steps=12345 env_steps/s=4100 episodes=3 return_mean=23.5 wait_frac=0.12 refused=2")
    assert line.offer({**beat, M.EPISODE_RETURNS: []}, now=15.0) is None
    assert line.offer({**beat, M.EPISODE_RETURNS: []}, now=20.0).startswith(
        "metrics env_steps=12345 env_steps/s=4100 episodes=0 wait_frac")  # no episode ended: no mean
    assert line.flush() is None  # nothing offered since that line
    assert line.offer({**beat, M.COLLECTOR_ENV_STEPS: 13000, M.EPISODE_RETURNS: [30.0]}, now=21.0) is None
    assert line.flush().startswith("metrics env_steps=13000 env_steps/s=4100 episodes=1 return_mean=30")  # last words
    assert line.flush() is None
    learner = {M.UPDATES: 58, M.UPDATES_PER_S: 11.6, M.SAMPLES_PER_S: 5939.2, M.POLICY_LOSS: -0.0123,
               M.VALUE_LOSS: 41.27, M.ENTROPY: 0.6, M.WAITING: 0, M.VERSION: 58, M.DIGEST_CHAIN: "ab"}
    assert format_line(learner, []) == ("metrics updates=58 updates/s=11.6 samples/s=5939 policy_loss=-0.0123 "
                                        "value_loss=41.3 entropy=0.6")


# ---------------------------------------------------------------- console


def test_tables_render_text_not_markup(capsys):
    console.get_console().print(console.build_table("runs", ["a"], [["[bold]literal"]]))
    assert "[bold]literal" in capsys.readouterr().out


def test_formatters():
    assert console.format_duration(12.34) == "12.3s"
    assert console.format_duration(245) == "4m05s"
    assert console.format_duration(2 * 3600 + 3 * 60 + 5) == "2h03m"
    assert console.format_duration(None) == "-"
    assert console.format_rate(12345.6) == "12.3k"
    assert console.format_rate(1.2e6) == "1.2M"
    assert console.format_rate(999.99) == "1.0k"
    assert console.format_rate(None) == "-"


@settings(max_examples=examples(200), deadline=None)
@given(st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-10**15, 10**15)))
def test_formatters_never_raise(x):
    assert isinstance(console.format_duration(x), str)
    assert isinstance(console.format_rate(x), str)


def test_progress_line_full_and_sparse():
    state = {"status": "running", "started_at": 100.0, "supervisor_pid": os.getpid(), "supervisor_start": OWN_START,
             "metrics": {"charts/env_steps": 123456, "charts/env_steps_per_s": 20000.0,
                         "charts/episode_return_mean": 210.5, "eval/return_mean": 480.1,
                         "learner/updates_per_s": 900.0}}
    assert console.progress_line(state, now=112.3) == (
        "[  12.3s] running env_steps=123456 (20.0k/s) return=210.5 eval=480.1 updates/s=900")
    rollout = {**state, "metrics": {**state["metrics"], "learner/samples_per_s": 6700.0,
                                    "learner/policy_lag_mean": 1.25, "learner/rollouts_dropped": 3}}
    assert console.progress_line(rollout, now=112.3).endswith("updates/s=900 samples/s=6.7k lag=1.2 dropped=3")
    assert " | ".join(console.header_lines(rollout, now=112.3)).endswith("| policy lag 1.2 | rollouts dropped 3")
    assert "lag" not in " | ".join(console.header_lines(state, now=112.3))
    assert console.progress_line({"status": "starting"}) == "[      -] starting"
    assert console.progress_line({}) == "[      -] unknown"
    assert console.progress_line({"status": "running", "metrics": None}).endswith("running")


def test_processes_table_rows_sparse_state():
    columns, rows = console.processes_table_rows({})
    assert columns[0] == "process" and rows == []
    state = {"processes": [{"name": "collector-0", "state": "running", "rate": 12345.6,
                            "rate_unit": "env steps/s", "last_heartbeat": 99.6},
                           {"name": "learner-0"}, "garbage"]}
    columns, rows = console.processes_table_rows(state, now=100.0)
    assert len(rows) == 2
    row = dict(zip(columns, (console._plain_cell(c) for c in rows[0])))
    assert row["rate"] == "12.3k env steps/s" and row["heartbeat"] == "0.4s ago" and row["state"] == "running"
    assert dict(zip(columns, rows[1]))["rate"] == "-"
    console.get_console().print(console.build_table("processes", columns, rows))  # renders without error


def test_runs_table_header_and_live_with_sparse_state(tmp_path, capsys):
    full = make_run(tmp_path, metrics={"charts/env_steps": 5000}, hosts=["localhost"])
    bare = RunDir.create(tmp_path, "bare")
    bare.plan_json.write_text("{}")
    columns, rows = console.runs_table_rows([full, bare])
    table = [dict(zip(columns, map(console._plain_cell, r))) for r in rows]
    assert table[0]["state"] == "running" and table[0]["env steps"] == "5,000" and table[0]["hosts"] == "localhost"
    assert table[1]["state"] == "unknown" and table[1]["job"] == "bare"
    header = " | ".join(console.header_lines({"status": "created"}))
    assert "created" in header
    failed = {"status": "failed", "exit_reason": "learner-0 exited with code 1 (see its log)",
              "failure": {"process": "learner-0", "exit_code": 1, "log_tail": ["Traceback", "[red]boom"]}}
    console.get_console().print(console.run_view(failed, live=False))
    out = capsys.readouterr().out
    # The exit reason once (the failure block does not say it again), then the process's last lines.
    assert out.count("exited with code 1") == 1 and "exit: learner-0 exited with code 1 (see its log)" in out
    assert "[red]boom" in out
    console.get_console().print(console.live_renderable(failed))
    # The live display leaves them to the attached `rlctl run`, which prints them after it.
    assert "exited with code" not in capsys.readouterr().out


def test_log_line_markup_prefix_and_stable_colour():
    text = log_view.log_line_markup("collector-3", "value [bold]x[/bold]", T0 + 0.5)
    assert text.plain == f"{time.strftime('%H:%M:%S', time.localtime(T0))}.500 collector-3 | value [bold]x[/bold]"
    assert log_view.role_colour("collector-0") == log_view.role_colour("collector-7")
    coloured = log_view.log_line_markup("learner-0", "\x1b[31mred\x1b[0m", T0)
    assert coloured.plain.endswith("| red")


def test_fast_path_imports_no_heavy_modules():
    code = ("import rlctl.rundir, rlctl.views.console, sys; "
            "print('torch' in sys.modules or 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    code = ("import rlctl.rundir, rlctl.views.console, sys; "
            "print(sorted(m for m in ('typer', 'pydantic', 'zmq', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_event_file_records_read_back_by_tensorboard(tmp_path):
    """rlctl's own TFRecord framing: CRC-32C's check value, tensorboard's masked CRC, and its reader's view."""
    import os

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    from rlctl.metrics import TensorBoardWriter, crc32c, masked_crc32c

    assert crc32c(b"123456789") == 0xE3069283
    for n in (0, 1, 7, 64, 3000):
        data = os.urandom(n)
        assert masked_crc32c(data) == reference(data)
    tb = TensorBoardWriter(str(tmp_path))
    for step in range(3):
        tb.scalars({"charts/episode_return": 10.0 * step, "losses/td_loss": 0.5}, step)
    tb.text("hyperparameters", "|param|value|\n|-|-|\n|lr|0.001|")
    tb.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [e.value for e in acc.Scalars("charts/episode_return")] == [0.0, 10.0, 20.0]
    assert [e.step for e in acc.Scalars("losses/td_loss")] == [0, 1, 2]
    assert "hyperparameters" in acc.Tags()["tensors"]


def test_status_json_over_all_runs_has_raw_numbers_under_snake_case_keys_newest_first(tmp_path):
    old = make_run(tmp_path, "old-job", status="finished", started_at=T0, ended_at=T0 + 20.5, supervisor_pid=dead_pid(),
                   exit_reason="charts/episode_return_mean 475.2 >= 475.0",
                   metrics={"charts/env_steps": 133_800, "charts/episode_return_mean": 480.25,
                            "eval/return_mean": 500.0}, hosts=["localhost"])
    time.sleep(1.1)  # run ids carry the second they were made
    new = make_run(tmp_path, "new-job", started_at=T0 + 100)
    bare = RunDir.create(tmp_path, "bare")
    bare.plan_json.write_text("{}")
    out = subprocess.run([sys.executable, "-m", "rlctl", "status", "--json", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    table = subprocess.run([sys.executable, "-m", "rlctl", "status", "--runs-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "250"})
    assert {r["run_id"] for r in rows} == {old.run_id, new.run_id, bare.run_id}
    assert all(r["run_id"] in table.stdout for r in rows)
    assert [r["run_id"] for r in rows] == [r.run_id for r in reversed(rundir.list_runs(tmp_path))]  # newest first
    keys = {"run_id", "job", "algorithm", "status", "exit_reason", "started_at", "elapsed_s", "env_steps",
            "return_mean", "eval_return_mean", "hosts", "run_dir"}
    assert all(set(r) == keys for r in rows)
    first = next(r for r in rows if r["run_id"] == old.run_id)
    assert first == {"run_id": old.run_id, "job": "old-job", "algorithm": "apex", "status": "finished",
                     "exit_reason": "charts/episode_return_mean 475.2 >= 475.0", "started_at": T0, "elapsed_s": 20.5,
                     "env_steps": 133_800, "return_mean": 480.25, "eval_return_mean": 500.0, "hosts": ["localhost"],
                     "run_dir": str(old.path)}
    unknown = next(r for r in rows if r["run_id"] == bare.run_id)
    assert unknown["status"] == "unknown" and unknown["env_steps"] is None and unknown["elapsed_s"] is None


def _busy_state(remote: bool) -> dict:
    """A running Ape-X job's state: long host names, every unit, a note, stop criteria, both waits reported."""
    hosts = ["gpu-node-017.cluster", "cpu-node-203.cluster"] if remote else ["localhost", "localhost"]
    procs = [{"name": "replay-0", "role": "replay", "rank": 0, "rate": 509.1, "rate_unit": "inserts/s"},
             {"name": "learner-0", "role": "learner", "rank": 0, "rate": 15100.0, "rate_unit": "samples/s"},
             {"name": "evaluator-0", "role": "evaluator", "rank": 0, "rate": 500.0, "rate_unit": "eval return"}]
    procs += [{"name": f"collector-{i}", "role": "collector", "rank": i, "rate": 1534.2, "rate_unit": "env steps/s",
               "note": "restarted: exit code -9 (SIGKILL)" if i == 11 else None} for i in range(12)]
    for i, p in enumerate(procs):
        p.update(host=hosts[int(p["role"] == "collector")], pid=120000 + i, state="running", restarts=i % 3,
                 last_heartbeat=T0 - 0.4, remote=remote)
    return {"run_id": "apex-cartpole-hosts-20261201-213332", "job": "apex-cartpole-hosts", "algorithm": "apex",
            "status": "running", "supervisor_pid": os.getpid(), "supervisor_start": OWN_START, "started_at": T0 - 85.0,
            "processes": procs,
            "stop": {"eval_return": 475.0, "eval_rounds": 3, "env_steps": 300_000, "wall_s": 600.0,
                     "train_return": None, "train_return_window": 20},
            "metrics": {"charts/env_steps": 169_199, "charts/env_steps_per_s": 2012.0,
                        "charts/episode_return_mean": 335.7, "eval/return_mean": 480.0, "eval/streak": 1,
                        "learner/data_wait_frac": 0.04, "collector/wait_frac": 0.62, "replay/size": 50_000},
            "host_rows": [{"name": h, "remote": remote, "state": "ok", "processes": 8, "running": 8}
                          for h in dict.fromkeys(hosts)]}


@pytest.mark.parametrize("remote", [False, True])
@pytest.mark.parametrize("width", [80, 200])
def test_live_table_and_status_fit_the_terminal_without_splitting_names_hosts_or_units(width, remote):
    from rich.console import Console

    state = _busy_state(remote)
    for view in (console.run_view(state, now=T0), console.run_view(state, now=T0, live=False)):
        con = Console(width=width, record=True, file=io.StringIO())
        con.print(view)
        text = con.export_text()
        lines = text.splitlines()
        assert max(map(len, lines)) <= width
        for p in state["processes"]:
            assert sum(p["name"] + " " in line or line.endswith(p["name"]) for line in lines) == 1, (p["name"], text)
            assert f"{console.format_rate(p['rate'])} {p['rate_unit']}" in text, (p, text)
        for word in ("restarts", "samples/s", "inserts/s", "env steps/s", "eval return"):
            assert word in text
        assert ("heartbeat" in text and "0.4s ago" in text) == (width == 200)  # gives way third, at 80 columns
        if width == 200 or remote:  # a remote host is never dropped before heartbeat age, rank and role
            for host in {p["host"] for p in state["processes"]}:
                assert host in text, text
        # The header: one line per concern, each whole.
        assert any("apex-cartpole-hosts-20261201-213332 (apex) | running | 1m25s" in line for line in lines), text
        assert any("env steps 169,199 (2.0k/s) | return 335.7 | eval 480.0" in line for line in lines)
        assert any("learner-bound: collectors wait 62% for replay room; learner waits 4%" in line for line in lines)
        assert any(re.search(r"env steps .*56% 169,199 / 300,000 .*ETA 1m05s", line) for line in lines), text
        # At the target, one round of three: 99% until the rounds are in.
        assert any(re.search(r"eval return .*99% 480.0 / 475 +1 of 3 in a row", line) for line in lines), text
        if width == 80:
            assert " pid " not in text and "120003" not in text  # pid gives way first
            last = next(line for line in lines if "collector-11" in line)
            assert last.rstrip().endswith("…") and "(SIGKILL)" not in text, text  # the note is cut, in one line
        else:
            assert "120003" in text


@pytest.mark.parametrize("width", [80, 200])
def test_runs_table_fits_without_splitting_run_ids(tmp_path, width):
    from rich.console import Console

    runs = [make_run(tmp_path, f"apex-cartpole-hosts-{i}", metrics={"charts/env_steps": 5000 * i},
                     hosts=["gpu-node-017.cluster", "cpu-node-203.cluster"]) for i in range(3)]
    con = Console(width=width, record=True, file=io.StringIO())
    con.print(console.runs_table(runs, width))
    text = con.export_text()
    assert max(map(len, text.splitlines())) <= width
    for r in runs:
        assert r.run_id in text, text


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(steps=st.integers(0, 2000), target_steps=st.integers(1, 2000), elapsed=st.floats(0, 100),
       wall=st.floats(0.5, 100), ev=st.one_of(st.none(), st.floats(-10, 10)), target_ev=st.floats(-10, 10),
       streak=st.integers(0, 5), rounds=st.integers(1, 4), ret=st.one_of(st.none(), st.floats(-10, 10)),
       seen=st.integers(0, 30))
def test_a_progress_bar_shows_100_percent_exactly_when_its_criterion_stops_the_run(
        steps, target_steps, elapsed, wall, ev, target_ev, streak, rounds, ret, seen):
    from rlctl.job.load import validate_job
    from rlctl.supervise.stop_progress import percent, stop_progress
    from rlctl.supervise.loop import StopCriteria

    stop = {"env_steps": target_steps, "wall_s": wall, "eval_return": target_ev, "eval_rounds": rounds,
            "train_return": 5.0, "train_return_window": 10}
    metrics = {"charts/env_steps": steps, "charts/env_steps_per_s": 10.0, "eval/streak": streak}
    if ev is not None:
        metrics["eval/return_mean"] = ev
    if ret is not None:
        metrics["charts/episode_return_mean"] = ret
    rows = stop_progress(stop, metrics, elapsed, seen)
    for p in rows:
        if p.fraction is not None:
            assert (percent(p.fraction) == 100) == p.met, p
    job = validate_job({"job": {"name": "t", "stop": stop}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "apex"}})
    reason = StopCriteria(job, started=0.0).reached(metrics, seen, elapsed)
    assert reason == next((p.reason for p in rows if p.met), None)


def test_run_files_are_written_private_and_whole_whatever_the_umask(tmp_path):
    """Issue 28 (9): `rlctl stop` of a lost run wrote state.json 0644 under umask 022; job.toml, plan.json and
    secrets.json were rewritten in place on resume. Every one now goes through the durable writer, mode 0600."""
    run = RunDir.create(tmp_path, "job")
    old = os.umask(0o022)
    try:
        run.write_state({"status": "running", "supervisor_pid": dead_pid()})
        run.write_job("[job]\nname = 'job'\n")
        run.write_plan("{}")
        run.write_secrets({"h": {"TOKEN": "s3cret"}})
        env = {**os.environ, "RLCTL_RUNS_DIR": str(tmp_path)}
        proc = subprocess.run([sys.executable, "-m", "rlctl", "stop", run.run_id], capture_output=True, text=True,
                              env=env, timeout=60)
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    assert run.read_state()["status"] == "stopped"
    for path in (run.state_json, run.job_toml, run.plan_json, run.secrets_json):
        assert (path.stat().st_mode & 0o777) == 0o600, (path, oct(path.stat().st_mode))
    assert not list(run.path.glob(".*.tmp"))
    assert run.read_secrets() == {"h": {"TOKEN": "s3cret"}}


@pytest.mark.slow  # end to end with real processes: the slow tier
def test_commands_that_rewrite_a_run_take_its_lock_in_turn(tmp_path):
    """Issue 28 (9): two `--resume` calls could both pass the liveness check (the loser wrote `failed` into the live
    run). A command that rewrites a run's files holds the run's lock: a second one waits for it, and gives up with
    exit 2 if it is held too long."""
    run = RunDir.create(tmp_path, "job")
    run.write_state({"status": "running", "supervisor_pid": dead_pid(), "processes": []})
    env = {**os.environ, "RLCTL_RUNS_DIR": str(tmp_path)}
    with run.lock():
        resume = subprocess.run([sys.executable, "-m", "rlctl", "run", "--resume", run.run_id], capture_output=True,
                                text=True, env=env, timeout=60)
        stop = start_cli(["stop", run.run_id], env=env)
        time.sleep(2.0)
        assert stop.poll() is None and run.read_state()["status"] == "running", "stop went ahead of the lock"
    out, err = stop.communicate(timeout=60)
    assert resume.returncode == 2 and "another rlctl command is changing run" in resume.stderr, resume.stderr
    assert stop.returncode == 0 and run.read_state()["status"] == "stopped", err


# ---------------------------------------------------------------- issue 30: progress that means something, 80 columns


def _render(renderable, width: int) -> str:
    from rich.console import Console

    con = Console(width=width, record=True, file=io.StringIO())
    con.print(renderable)
    return con.export_text()


def _progress_state(**over) -> dict:
    """A running Ape-X job 30 s into its progress history: env steps at 2,300/s (while the collectors' own figure
    reads 0.0), the eval return rising 0.3 a second to 429 of 475."""
    state = _busy_state(False)
    state["metrics"].update({"eval/return_mean": 429.0, "eval/streak": 0, "charts/env_steps_per_s": 0.0})
    state["stop"]["train_return"] = 475.0
    state["progress_history"] = [[T0 - 29 + i, 102_499 + 2300 * i, 300.0 + i, 420.3 + 0.3 * i] for i in range(30)]
    state["return_history"] = [10.0, 50.0, 30.0, 80.0, 90.0, 120.0]
    return {**state, **over}


def test_the_eval_bar_is_the_value_against_its_target_and_a_finished_run_estimates_nothing():
    """Issue 30: the eval bar read 0% at 429 / 475 (it counted rounds in a row); a finished run kept the wall-time
    cap's ETA."""
    from rlctl.supervise.stop_progress import percent, stop_progress

    state = _progress_state()
    rows = {p.criterion: p for p in console.stop_rows(state, now=T0)}
    assert rows["eval_return"].fraction == pytest.approx(429 / 475) and percent(rows["eval_return"].fraction) == 90
    assert rows["eval_return"].note == "0 of 3 in a row"
    # From its own trend: 0.3 a second, 46 to go.
    assert rows["eval_return"].eta_s == pytest.approx(46 / 0.3, rel=0.01)
    assert rows["train_return"].fraction == pytest.approx(335.7 / 475) and rows["train_return"].eta_s is not None
    assert rows["env_steps"].limit and rows["wall_s"].limit and rows["wall_s"].exact
    text = _render(console.run_view(state, now=T0, live=False), 80)
    assert re.search(r"eval return +━+─+ 90% 429.0 / 475 +0 of 3 in a row +ETA 2m33s", text), text
    assert re.search(r"wall time +━+─+ 14% 1m25s / 10m00s +limit +8m35s left", text), text
    assert "ETA 57s (env steps)" in text  # the run's end: the step limit comes first
    # Returns falling: no trend to extrapolate, "—" rather than a number.
    falling = _progress_state(progress_history=[[T0 - 29 + i, 1000 * i, 300.0 - i, 460.0 - i] for i in range(30)])
    assert re.search(r"eval return .* ETA —", _render(console.run_view(falling, now=T0, live=False), 80))
    for status in ("finished", "stopped", "failed"):
        over = _progress_state(status=status, ended_at=T0, exit_reason="eval/return_mean 480.0 >= 475")
        text = _render(console.run_view(over, now=T0, live=False), 80)
        assert "ETA" not in text and " left" not in text, text
        assert all(p.eta_s is None for p in console.stop_rows(over, now=T0))
        assert "env steps 169,199 (avg 2.0k/s)" in text and text.count("480.0 >= 475") == 1, text
    # The supervisor's stop rule reads the same rows: history or not, the same criteria are met.
    plain = stop_progress(state["stop"], state["metrics"], 85.0, 100)
    assert [p.met for p in plain] == [p.met for p in rows.values()] and all(p.eta_s is None for p in plain[:2])


def test_rates_are_over_a_window_and_counts_are_whole_numbers():
    """Issue 30: the rate blinked to (0.0/s) while steps advanced; zero printed as `env steps 0.0`."""
    state = _progress_state()
    assert "env steps 169,199 (2.3k/s)" in console.header_lines(state, now=T0)[1]
    assert "env_steps=169199 (2.3k/s)" in console.progress_line(state, now=T0)
    fresh = {"status": "running", "started_at": T0 - 1, "metrics": {"charts/env_steps": 0}}
    assert console.header_lines(fresh, now=T0)[1].startswith("env steps 0 |")
    # A heartbeat late by more than the window: the rate is over the last two points, not zero.
    late = _progress_state(progress_history=[[T0 - 40, 100_000, None, None], [T0 - 25, 130_000, None, None]])
    assert "(2.0k/s)" in console.header_lines(late, now=T0)[1]


@pytest.mark.parametrize("live", [True, False])
def test_the_header_keeps_eval_return_eta_and_rates_whole_at_80_columns(live):
    """Issue 30: the live header cut the eval figure (`eval 50…`) to keep the sparkline, and ETAs were cut into
    plausible wrong values (`ETA 9m`)."""
    state = _progress_state(run_id="impala-cartpole-long-name-20261201-213332", algorithm="impala")
    state["metrics"].update({"learner/policy_lag_mean": 1.25, "learner/rollouts_dropped": 12345})
    for width in (80, 200):
        text = _render(console.run_view(state, now=T0, live=live), width)
        lines = text.splitlines()
        assert max(map(len, lines)) <= width
        for whole in ("impala-cartpole-long-name-20261201-213332 (impala) | running | 1m25s", "env steps 169,199 (2.3k/s)",
                      "return 335.7", "eval 429.0", "ETA 57s (env steps)", "policy lag 1.2", "rollouts dropped 12345",
                      "ETA 2m33s", "8m35s left", "429.0 / 475", "169,199 / 300,000", "1m25s / 10m00s"):
            assert any(whole in line for line in lines), (whole, text)
        assert ("▁" in text) == (width == 200), text  # the sparkline gives way first
        assert "…" not in "".join(line for line in lines if "ETA" in line or "eval" in line)


@pytest.mark.parametrize("width", [80, 200])
def test_compare_of_three_runs_shows_every_run_id_and_its_time_to_target(tmp_path, width):
    """Issue 30: at 80 columns `rlctl compare` of 3 runs showed the first run's column only and chopped the second
    mid-word without an ellipsis."""
    from rlctl.job.load import validate_job
    from rlctl.job.resolved import resolved_dict
    from rlctl.job.toml_writer import dumps_toml

    made = []
    for i, (lr, reason, seconds) in enumerate(((1e-3, "eval/return_mean 480.0 >= 475 (3 rounds in a row)", 120),
                                               (3e-4, "wall time 600s >= 600s", 600),
                                               (5e-4, "eval/return_mean 476.0 >= 475 (3 rounds in a row)", 1235))):
        rd = RunDir.create(tmp_path, "apex-cartpole-hosts", now=T0 + i)
        job = validate_job({"job": {"name": "apex-cartpole-hosts", "stop": {"eval_return": 475.0, "wall_s": 600}},
                            "env": {"id": "CartPole-v1"}, "algorithm": {"name": "apex", "lr": lr}})
        rd.job_toml.write_text(dumps_toml(resolved_dict(job)))
        rd.write_state({"run_id": rd.run_id, "status": "finished", "started_at": T0, "ended_at": T0 + seconds,
                        "exit_reason": reason, "metrics": {"charts/env_steps": 1000 * seconds}})
        made.append(rd)
    text = _render(compare_view.compare_view(made), width)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width
    for rd, to_target in zip(made, ("2m00s", "not reached", "20m35s")):
        assert rd.run_id in text, text
        if width == 80:  # one row per run, its time to target beside it
            assert re.search(rf"{rd.run_id} +{to_target} ", next(line for line in lines if rd.run_id in line)), text
    if width == 200:  # one column per run
        assert re.search(r"time to target +2m00s +not reached +20m35s", text), text
    else:
        assert "left out at 80 columns:" in text and "use a wider terminal or --json" in text
        assert re.search(r"algorithm.lr +0.001 +0.0003 +0.0005", text), text
        assert "3 stopped because eval/return_mean 476.0 >= 475 (3 rounds in a row)" in text


def test_the_supervisor_keeps_a_progress_history_that_the_rates_and_etas_read(tmp_path):
    """Each metrics point adds [time, env steps, mean return, eval return] to state.json's progress_history."""
    from rlctl.job.load import validate_job
    from rlctl.metrics import MetricsHub
    from rlctl.supervise.metrics_sink import MetricsSink
    from rlctl.supervise.stop_progress import EVAL, STEPS, window_rate

    job = validate_job({"job": {"name": "t"}, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "apex"}})
    rd = RunDir.create(tmp_path, "t")
    hub = MetricsHub()
    sink = MetricsSink(job, rd.run_id, rd, hub, None, own_losses=lambda: (0, 0))
    sink.open_tensorboard(time.time())
    try:
        hub.on_heartbeat("collector-0", "collector", {"env_steps": 1000, "charts/env_steps_per_s": 0.0})
        sink.write_point()
        hub.on_heartbeat("collector-0", "collector", {"env_steps": 3000, "episode_returns": [20.0]})
        hub.on_heartbeat("evaluator-0", "evaluator", {"eval/return_mean": 50.0})
        sink.write_point()
    finally:
        sink.tb.close()
    first, second = sink.progress_history
    assert first[STEPS] == 1000 and first[EVAL] is None and second[1:] == [3000, 20.0, 50.0]
    assert second[0] >= first[0]
    assert window_rate([[0.0, *first[1:]], [2.0, *second[1:]]]) == 1000.0  # the steps between two points per second


def test_columns_sets_the_width_of_piped_tables(tmp_path):
    for i in range(3):
        make_run(tmp_path, f"a-rather-long-job-name-{i}", status="finished", started_at=T0, ended_at=T0 + 20.5,
                 supervisor_pid=dead_pid(), metrics={"charts/env_steps": 133_800, "charts/episode_return_mean": 480.25},
                 hosts=["localhost", "gpu-box-number-two"])
    widths = {}
    for columns in ("100", ""):
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        out = subprocess.run([sys.executable, "-m", "rlctl", "status", "--runs-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                             env={**env, **({"COLUMNS": columns} if columns else {})})
        assert out.returncode == 0, out.stderr
        widths[columns] = max(map(len, out.stdout.splitlines()))
    assert 80 < widths["100"] <= 100 < widths[""], widths  # without COLUMNS a pipe gets whole values
