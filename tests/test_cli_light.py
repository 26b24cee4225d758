"""The CLI fails fast and stays light: the watching commands import no torch, numpy or pydantic on --help, status,
logs or stop; bad input is one line and exit 2 before anything heavy is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from rlctl.cli import app
try:
    app({args!r}, standalone_mode=False)
except BaseException:
    pass
print(sorted(m for m in ("torch", "numpy", "pydantic", "zmq") if m in sys.modules))
"""


@pytest.mark.parametrize("args", [["--help"], ["status"], ["status", "--json"], ["logs"], ["stop"], ["watch"],
                                  ["rm", "x"], ["prune", "--older-than", "7d"]])
def test_watching_commands_import_nothing_heavy(tmp_path, args):
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
                         env={"RLCTL_RUNS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


# Bad input fails fast: one line on stderr, exit 2, never a traceback (issue 30).

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return lines[0]


def _runs_dirs_that_cannot_be_made(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [(str(a_file), "it is not a folder"), (str(a_file / "runs"), "Not a directory")]
    if __import__("os").path.isdir("/sys/kernel"):  # sysfs refuses new folders even to root
        cases.append(("/sys/rlctl-runs", "Operation not permitted"))
    return cases


def test_a_runs_directory_that_cannot_be_made_is_one_line_naming_the_way_out(tmp_path):
    from conftest import run_cli

    for runs_dir, why in _runs_dirs_that_cannot_be_made(tmp_path):
        for how in (["--runs-dir", runs_dir], ["--detach"]):
            proc = run_cli(["run", str(REPO / "jobs" / "apex.toml"), *how], expected_exit=None,
                           env={"RLCTL_RUNS_DIR": runs_dir}, cwd=tmp_path)
            line = _one_line(proc)
            assert line.startswith(f"rlctl: cannot create a run directory in {runs_dir}: {why}; "), line
            assert "--runs-dir" in line and "RLCTL_RUNS_DIR" in line


def test_plot_out_into_a_missing_folder_is_one_line_before_any_run_is_read(tmp_path):
    from conftest import run_cli

    proc = run_cli(["plot", "--out", "/missing/dir/x.png", "--runs-dir", str(tmp_path)], expected_exit=None)
    assert _one_line(proc) == "--out /missing/dir/x.png: there is no folder /missing/dir"
    proc = run_cli(["plot", "--out", str(tmp_path), "--runs-dir", str(tmp_path)], expected_exit=None)
    assert _one_line(proc).startswith(f"--out {tmp_path}: a folder; give a file name")


def test_eval_of_a_file_that_is_no_checkpoint_is_one_line_before_torch_is_imported(tmp_path):
    from conftest import run_cli

    job = REPO / "jobs" / "apex.toml"
    line = _one_line(run_cli(["eval", str(job)], expected_exit=None))
    assert line.startswith(f"{job}: a job file, not a checkpoint: give a run (id or prefix) or a checkpoint file"), line
    assert line.endswith("a job file goes with --job")
    noise = tmp_path / "noise.bin"
    noise.write_bytes(bytes(range(7, 256)) * 8)
    line = _one_line(run_cli(["eval", str(noise)], expected_exit=None))
    assert line.startswith(f"{noise}: not a checkpoint (torch.save writes a zip archive"), line
    probe = subprocess.run([sys.executable, "-c", PROBE.format(args=["eval", str(job)]).replace('"numpy", ', "")],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert probe.stdout.strip().splitlines()[-1] == "[]" and "a job file, not a checkpoint" in probe.stderr, \
        probe.stdout + probe.stderr
