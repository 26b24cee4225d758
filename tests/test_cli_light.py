"""The watching commands stay light: no torch, numpy or pydantic on --help, status, logs or stop."""

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
