"""A role of many processes is one row of the live table and `rlctl status` (counts by state, rates as sum, min and
median), followed by those of its processes that are not running; `rlctl status RUN --all` lists every process."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, run_cli
from rlctl.rundir import RunDir
from rlctl.views.role_fold import FOLD_OVER, RoleSummary, fold_roles


def processes(collectors: int, not_running: dict[int, str] = (), hosts: int = 16, now: float = 1000.0) -> list[dict]:
    """state.json's process rows: a learner, `collectors` collectors spread over `hosts`, an evaluator."""
    rows = [{"name": "learner-0", "role": "learner", "rank": 0, "host": "head", "pid": 10, "state": "running",
             "restarts": 0, "rate": 120.0, "rate_unit": "updates/s", "last_heartbeat": now - 0.5}]
    for i in range(collectors):
        state = dict(not_running).get(i, "running")
        rows.append({"name": f"collector-{i}", "role": "collector", "rank": i, "host": f"h{i % hosts}",
                     "pid": 1000 + i, "state": state, "restarts": int(state != "running"), "rate": 1000.0 + i,
                     "rate_unit": "env steps/s", "last_heartbeat": now - 1 - i % 3, "remote": True,
                     "note": "exit 1" if state != "running" else None})
    rows.append({"name": "evaluator-0", "role": "evaluator", "rank": 0, "host": "head", "pid": 9, "state": "running",
                 "restarts": 0, "last_heartbeat": now - 1})
    return rows


def test_a_thousand_collectors_are_one_row_then_the_two_that_are_restarting():
    rows = fold_roles(processes(1000, {17: "restarting", 503: "restarting"}))
    assert [r.role if isinstance(r, RoleSummary) else r["name"] for r in rows] == [
        "learner-0", "collector", "collector-17", "collector-503", "evaluator-0"]
    s = rows[1]
    assert (s.count, s.states, s.restarts, len(s.hosts), s.ranks[0], s.ranks[-1]) == (
        1000, (("running", 998), ("restarting", 2)), 2, 16, 0, 999)
    assert not s.all_running
    running_rates = [1000.0 + i for i in range(1000) if i not in (17, 503)]
    total, low, median = s.rate_figures()
    assert total == sum(running_rates) and low == 1000.0 and median == 1499.5  # 998 rates: 1000-1999 less two
    assert s.rate_unit == "env steps/s" and s.oldest_heartbeat == 1000.0 - 3


def test_a_role_folds_only_above_the_limit():
    at_limit = fold_roles(processes(FOLD_OVER))
    assert not any(isinstance(r, RoleSummary) for r in at_limit) and len(at_limit) == FOLD_OVER + 2
    over = fold_roles(processes(FOLD_OVER + 1))
    assert [type(r) for r in over] == [dict, RoleSummary, dict] and over[1].all_running


rows_of_any_shape = st.lists(st.dictionaries(
    st.sampled_from(["name", "role", "rank", "host", "state", "restarts", "rate", "rate_unit", "last_heartbeat"]),
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats() | st.sampled_from(["collector", "running", "lost"])
    | st.text(max_size=3), max_size=9), max_size=40)


@settings(max_examples=examples(300), deadline=None)
@given(rows=rows_of_any_shape, fold_over=st.integers(0, 4))
def test_folding_any_state_rows_keeps_every_process_that_is_not_running_in_sight(rows, fold_over):
    folded = fold_roles(rows, fold_over)
    shown = {id(r) for r in folded if not isinstance(r, RoleSummary)}
    summaries = {r.role: r for r in folded if isinstance(r, RoleSummary)}
    for p in rows:  # each process is a row of its own, or counted in its role's; a process not running is both
        role = str(p.get("role") or "-")
        assert (id(p) in shown) == (role not in summaries or p.get("state") != "running"), (p, folded)
    assert sum(s.count for s in summaries.values()) == sum(str(p.get("role") or "-") in summaries for p in rows)
    for s in summaries.values():
        assert sum(n for _, n in s.states) == s.count > fold_over
        s.rate_figures()


def test_status_shows_a_large_role_as_one_row_and_all_lists_each(tmp_path):
    run = RunDir.create(tmp_path, "many")
    now = time.time()
    run.write_state({"run_id": run.run_id, "status": "running", "started_at": now - 60,
                     "processes": processes(40, {7: "restarting"}, hosts=4, now=now)})
    env = {"COLUMNS": "200"}
    folded = run_cli(["status", run.run_id, "--runs-dir", str(tmp_path)], env=env).stdout
    names = [line.split()[0] for line in folded.splitlines() if line.startswith(("learner", "collector", "evaluator"))]
    assert names == ["learner-0", "collector", "collector-7", "evaluator-0"], folded
    line = next(line for line in folded.splitlines() if line.startswith("collector x40"))
    assert "39 running, 1 restarting" in line and "4 hosts" in line and "0-39" in line, line
    assert "39.8k env steps/s" in line and line.endswith("rates: min 1.0k, median 1.0k"), line
    every = run_cli(["status", run.run_id, "--all", "--runs-dir", str(tmp_path)], env=env).stdout
    assert [f"collector-{i}" in every.split() for i in range(40)] == [True] * 40 and "collector x40" not in every
    refused = run_cli(["status", "--all", "--runs-dir", str(tmp_path)], expected_exit=2)
    assert refused.stderr.strip() == "rlctl status: --all lists one run's processes: name the run (rlctl status RUN --all)"
