"""`rlctl plot` over run directories whose TensorBoard files the supervisor's own writer made: the terminal chart,
the PNG, runs lacking the metric, --smooth, --group, --csv and readable ticks."""

from __future__ import annotations

import csv
import io

import pytest

from conftest import needs_extra, run_cli
from rlctl.metrics import TensorBoardWriter
from rlctl.rundir import RunDir
from rlctl.views.curve_data import Curve, smoothed
from rlctl.views.curves import tick_label

RETURN = "charts/episode_return_mean"
T0 = 1_790_000_000.0


def _run(runs, job: str, at: float, points: dict[str, list[float]], step: int = 1000) -> RunDir:
    """A finished run of `job` whose TensorBoard file holds these scalars, point k at env step k * step."""
    rd = RunDir.create(runs, job, now=at)  # its own `now`: run ids carry the second, no sleeping
    rd.write_state({"run_id": rd.run_id, "job": job, "algorithm": "ppo", "status": "finished",
                    "started_at": at, "ended_at": at + 30})
    tb = TensorBoardWriter(str(rd.tb_dir))
    for k in range(max(map(len, points.values()))):
        tb.scalars({tag: ys[k] for tag, ys in points.items() if k < len(ys)}, step=step * k, wall=at + k)
    tb.close()
    return rd


def _curve_runs(tmp_path):
    """A rising and a flat return curve."""
    runs = tmp_path / "runs"
    a = _run(runs, "curve-0", T0, {RETURN: [10.0 + 20 * k for k in range(25)]})
    b = _run(runs, "curve-1", T0 + 1, {RETURN: [50.0] * 25})
    return runs, (a, b)


def _plot(runs, *args, code: int = 0):
    return run_cli(["plot", *args, "--runs-dir", str(runs)], expected_exit=code, env={"COLUMNS": "80"})


def _csv(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


@needs_extra("plot", "matplotlib")
def test_plot_draws_runs_in_the_terminal_and_into_a_png(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    runs, (a, b) = _curve_runs(tmp_path)
    out = _plot(runs, a.run_id, b.run_id)
    lines = out.stdout.splitlines()
    assert lines[0] == "charts/episode_return_mean against env steps"
    assert max(map(len, lines)) <= 80 and any(line.startswith("  ● " + a.run_id) for line in lines), out.stdout
    assert any(line.startswith("  ▲ " + b.run_id) for line in lines)
    grid = [line for line in lines if "│" in line]
    assert len(grid) == 16 and sum(line.count("●") for line in grid) >= 20 and sum(line.count("▲") for line in grid) >= 20
    # The rising run's last point is at the top right, the flat run on one row.
    assert grid[0].rstrip().endswith("●") and grid[0].lstrip().startswith("490")
    assert len({i for i, line in enumerate(grid) if "▲" in line}) == 1
    assert lines[len(grid) + 2].split() == ["0", "24k"]  # the x range: env steps 0 to 24,000
    wall = _plot(runs, a.run_id, "--x", "wall_s").stdout
    assert "against wall time (s)" in wall and " 24\n" in wall  # 24 s from the first point to the last

    png = tmp_path / "curves.png"
    _plot(runs, a.run_id, b.run_id, "--out", str(png))
    image = mpimg.imread(png)[..., :3]
    assert image.shape[:2] == (450, 800)
    coloured = (image.max(axis=2) - image.min(axis=2)) > 0.3  # lines and legend marks, not grey axes or text
    assert coloured.sum() > 1500
    blue, orange = np.array([0.12, 0.47, 0.71]), np.array([1.0, 0.5, 0.05])  # matplotlib's first two colours
    for colour in (blue, orange):
        assert (np.abs(image - colour).max(axis=2) < 0.08).sum() > 300, colour

    assert "--x must be one of" in _plot(runs, "--x", "updates", code=2).stderr


def test_runs_lacking_the_metric_are_skipped_with_a_warning_and_none_having_it_lists_every_tag(tmp_path):
    runs = tmp_path / "runs"
    tags = {f"learner/figure_{i:02d}": [float(i)] * 3 for i in range(30)}
    without = _run(runs, "no-eval", T0, {RETURN: [1.0, 2.0, 3.0], **tags})
    with_eval = _run(runs, "eval", T0 + 1, {RETURN: [1.0, 2.0, 3.0], "eval/return_mean": [5.0, 6.0, 7.0]})
    out = _plot(runs, without.run_id, with_eval.run_id, "--metric", "eval/return_mean")
    assert out.stderr.strip() == (f"rlctl plot: warning: skipped {without.run_id}: no scalar 'eval/return_mean' in "
                                  "its TensorBoard files")
    assert with_eval.run_id in out.stdout and without.run_id not in out.stdout

    bad = _plot(runs, without.run_id, "--metric", "eval/return_mean", code=2)
    listed = " ".join(bad.stderr.split())  # the console wraps a long line
    assert f"{without.run_id}: no scalar 'eval/return_mean'" in listed and "its 31 scalar tags:" in listed
    assert all(tag in listed for tag in [RETURN, *tags]), listed  # every tag, not only charts/ and eval/
    both = " ".join(_plot(runs, without.run_id, with_eval.run_id, "--metric", "nothing", code=2).stderr.split())
    assert "none of the 2 runs has a scalar 'nothing'; their 32 scalar tags:" in both and "eval/return_mean" in both


def test_csv_holds_every_point_of_every_run_as_written(tmp_path):
    runs, (a, b) = _curve_runs(tmp_path)
    out = _plot(runs, a.run_id, b.run_id, "--csv", "-")
    rows = _csv(out.stdout)
    assert list(rows[0]) == ["run", "x", "value"] and len(rows) == 50
    assert [(r["x"], r["value"]) for r in rows if r["run"] == a.run_id] == [(str(1000 * k), str(10 + 20 * k))
                                                                           for k in range(25)]
    assert {r["value"] for r in rows if r["run"] == b.run_id} == {"50"}
    path = tmp_path / "points.csv"
    assert _plot(runs, a.run_id, "--csv", str(path), "--smooth", "3").stdout.strip() == str(path)
    smooth = [float(r["value"]) for r in _csv(path.read_text())]
    assert smooth == [10.0, 20.0] + [10.0 + 20 * k for k in range(1, 24)]  # each the mean of up to 3 points
    assert "cannot write --csv" in _plot(runs, a.run_id, "--csv", str(tmp_path), code=2).stderr  # a folder


def test_group_draws_each_job_as_the_mean_of_its_runs_with_a_band(tmp_path):
    runs = tmp_path / "runs"
    made = [_run(runs, "ppo-cart", T0 + i, {RETURN: [base + k for k in range(10)]}) for i, base in enumerate((10, 20, 30))]
    # A shorter run of another job, on other steps: interpolated, and its job over its own range only.
    other = _run(runs, "a2c-cart", T0 + 5, {RETURN: [100.0, 200.0, 300.0]}, step=1500)
    ids = [rd.run_id for rd in made] + [other.run_id]
    rows = _csv(_plot(runs, *ids, "--group", "--csv", "-").stdout)
    assert list(rows[0]) == ["run", "x", "value", "low", "high"]
    mean = [r for r in rows if r["run"] == "ppo-cart (mean of 3 runs, min-max band)"]
    assert [(r["x"], r["value"], r["low"], r["high"]) for r in mean] == [
        (str(1000 * k), str(20 + k), str(10 + k), str(30 + k)) for k in range(10)]
    single = [r for r in rows if r["run"] == "a2c-cart (mean of 1 run, min-max band)"]
    assert [r["x"] for r in single] == ["0", "1500", "3000"] and single[0]["low"] == single[0]["high"] == "100"
    std = _csv(_plot(runs, *ids[:3], "--group", "--band", "std", "--csv", "-").stdout)
    spread = (200 / 3) ** 0.5  # the population std of 10, 20, 30
    assert abs(float(std[0]["low"]) - (20 - spread)) < 1e-9 and abs(float(std[0]["high"]) - (20 + spread)) < 1e-9

    drawn = _plot(runs, *ids[:3], "--group").stdout
    assert "● ppo-cart (mean of 3 runs, min-max band)  (last 29, 10 points)" in drawn and "░" in drawn
    assert not any(rd.run_id in drawn for rd in made)
    assert "--band must be one of" in _plot(runs, "--group", "--band", "iqr", code=2).stderr


@needs_extra("plot", "matplotlib")
def test_group_shades_the_band_in_the_png(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    runs = tmp_path / "runs"
    ids = [_run(runs, "ppo-cart", T0 + i, {RETURN: [base + 5 * k for k in range(10)]}).run_id
           for i, base in enumerate((0, 40))]
    png = tmp_path / "group.png"
    _plot(runs, *ids, "--group", "--out", str(png))
    image = mpimg.imread(png)[..., :3]
    shade = np.array([0.12, 0.47, 0.71]) * 0.2 + 0.8  # matplotlib's first colour at alpha 0.2 over white
    assert (np.abs(image - shade).max(axis=2) < 0.04).sum() > 5000


def _sweep_with_curves(tmp_path):
    """A sweep of 2 learning rates x 2 seeds whose trials' TensorBoard files the supervisor's writer made (and a
    third rate never begun)."""
    from rlctl.sweep_dir import SweepDir

    sweep = SweepDir(tmp_path / "runs" / "lrs-20260101-000000")
    sweep.path.mkdir(parents=True)
    trials = [{"id": f"t00{i}", "values": {"algorithm.lr": lr, "model.hidden": [64]}, "seed": seed}
              for i, (lr, seed) in enumerate([(1e-3, 1), (1e-3, 2), (4e-3, 1), (4e-3, 2), (8e-3, 1)])]
    sweep.write({"sweep_id": sweep.sweep_id, "name": "lrs", "status": "finished", "max_concurrent": 2,
                 "params": ["algorithm.lr", "model.hidden"], "trials": trials})
    for i, t in enumerate(trials[:4]):
        rd = RunDir(sweep.path / t["id"])
        rd.tb_dir.mkdir(parents=True)
        rd.write_state({"run_id": t["id"], "job": "ppo-cart", "status": "finished", "started_at": T0,
                        "ended_at": T0 + 30})
        tb = TensorBoardWriter(str(rd.tb_dir))
        for k in range(5):
            tb.scalars({RETURN: 10.0 * i + k}, step=1000 * k, wall=T0 + k)
        tb.close()
    return sweep


def test_group_by_draws_a_sweep_as_one_curve_per_value_of_a_parameter_over_its_seeds(tmp_path):
    sweep = _sweep_with_curves(tmp_path)
    runs = sweep.path.parent
    rows = _csv(_plot(runs, sweep.sweep_id, "--group-by", "lr", "--csv", "-").stdout)
    assert sorted({r["run"] for r in rows}) == ["lr=0.001 (mean of 2 runs, min-max band)",
                                                "lr=0.004 (mean of 2 runs, min-max band)"]
    first = [(r["x"], r["value"], r["low"], r["high"]) for r in rows if r["run"].startswith("lr=0.004")][0]
    assert first == ("0", "25", "20", "30")  # t002 and t003: 20 + k and 30 + k
    same = _csv(_plot(runs, sweep.sweep_id, "--group-by", "algorithm.lr", "--band", "std", "--csv", "-").stdout)
    assert (same[0]["value"], same[0]["low"], same[0]["high"]) == ("5", "0", "10") and len(same) == len(rows)
    each = _csv(_plot(runs, sweep.sweep_id, "--csv", "-").stdout)  # no grouping: a curve per trial that began
    assert sorted({r["run"] for r in each}) == ["t000", "t001", "t002", "t003"]
    bad = _plot(runs, sweep.sweep_id, "--group-by", "gamma", code=2).stderr
    assert "--group-by 'gamma': not a parameter of lrs-20260101-000000; its parameters: algorithm.lr, model.hidden" \
        in bad and "Traceback" not in bad
    assert "--group-by groups the trials of one sweep" in _plot(runs, "t000", "--group-by", "lr", code=2).stderr


@needs_extra("plot", "matplotlib")
def test_group_by_writes_a_png_with_a_band_per_value(tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    sweep = _sweep_with_curves(tmp_path)
    png = tmp_path / "lrs.png"
    _plot(sweep.path.parent, sweep.sweep_id, "--group-by", "lr", "--out", str(png))
    image = mpimg.imread(png)[..., :3]
    shade = np.array([0.12, 0.47, 0.71]) * 0.2 + 0.8  # matplotlib's first colour at alpha 0.2 over white
    assert (np.abs(image - shade).max(axis=2) < 0.04).sum() > 1000


def test_ticks_read_as_numbers_people_write(tmp_path):
    assert [tick_label(v) for v in (0, 490, 12.5, -3.25, 0.0031, 1000, 24_000, 210_400, 999_999, 1_200_000,
                                    -2_500_000, 3.4e9)] == [
        "0", "490", "12.5", "-3.25", "0.0031", "1k", "24k", "210k", "1M", "1.2M", "-2.5M", "3.4G"]
    runs = tmp_path / "runs"
    rd = _run(runs, "long", T0, {RETURN: [float(k) for k in range(50)]}, step=4208)
    drawn = _plot(runs, rd.run_id).stdout
    assert "206k" in drawn and "e+" not in drawn  # 49 * 4208 env steps


def test_smoothing_is_a_trailing_moving_average():
    curve = smoothed(Curve("r", [0, 1, 2, 3, 4], [0.0, 10.0, 20.0, 30.0, 40.0]), 2)
    assert curve.ys == [0.0, 5.0, 15.0, 25.0, 35.0] and curve.xs == [0, 1, 2, 3, 4]
    assert smoothed(curve, 1) is curve


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_smooth_below_one_is_refused(tmp_path, bad):
    runs, (a, _) = _curve_runs(tmp_path)
    assert _plot(runs, a.run_id, "--smooth", bad, code=2).stderr
