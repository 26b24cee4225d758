"""Shell completions: the committed scripts match what the CLI generates, and TAB completes run ids."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPLETIONS = REPO / "completions"
GENERATE = COMPLETIONS / "generate.py"
SHELLS = ("bash", "zsh", "fish")
RUN_A = "apex-cartpole-20250101-120000"
RUN_B = "other-job-20250102-080000"


def _load_generator():
    spec = importlib.util.spec_from_file_location("rlctl_completions_generate", GENERATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def script(shell: str) -> str:
    return (COMPLETIONS / f"rlctl.{shell}").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return {shell: gen.render(shell) for shell in SHELLS}


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    """An `rlctl` executable in a folder of its own, running this checkout's CLI with this interpreter."""
    bin_dir = tmp_path_factory.mktemp("bin")
    path = bin_dir / "rlctl"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom rlctl.cli import main\nsys.exit(main())\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def runs(tmp_path) -> Path:
    """A runs folder with two finished fake runs."""
    root = tmp_path / "runs"
    for i, run_id in enumerate((RUN_A, RUN_B)):
        (root / run_id).mkdir(parents=True)
        (root / run_id / "state.json").write_text(json.dumps({"run_id": run_id, "status": "finished", "started_at": i + 1}))
    (root / "not-a-run").mkdir()  # no state.json: never offered
    return root


def instruction(shell: str) -> str:
    """The `_RLCTL_COMPLETE=...` value the generated script uses at TAB time (typer: complete_bash)."""
    found = set(re.findall(r"_RLCTL_COMPLETE=(\w+)", script(shell)))
    assert len(found) == 1, found
    return found.pop()


def complete(shim: Path, shell: str, env: dict) -> list[str]:
    proc = subprocess.run([sys.executable, str(shim)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "_RLCTL_COMPLETE": instruction(shell), **env})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout.split("\n")


def bash_complete(shim: Path, words: str, cword: int, runs_dir: Path | None = None) -> list[str]:
    env = {"COMP_WORDS": words, "COMP_CWORD": str(cword)}
    if runs_dir is not None:
        env["RLCTL_RUNS_DIR"] = str(runs_dir)
    return [line for line in complete(shim, "bash", env) if line]


# ---------------------------------------------------------------------------------------------- generated scripts


@pytest.mark.parametrize("shell", SHELLS)
def test_committed_script_is_current(shell, generated):
    assert script(shell) == generated[shell], f"completions/rlctl.{shell} is stale: run python completions/generate.py"


def test_generate_check_passes_on_repo():
    proc = subprocess.run([sys.executable, str(GENERATE), "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generate_writes_and_check_detects_drift(tmp_path):
    out = tmp_path / "c"
    run = lambda *a: subprocess.run([sys.executable, str(GENERATE), "--dir", str(out), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    missing = run("--check")
    assert missing.returncode == 1 and "missing" in missing.stdout
    assert not out.exists()  # --check writes nothing
    assert run().returncode == 0
    for shell in SHELLS:
        assert (out / f"rlctl.{shell}").read_text() == script(shell)
    assert run("--check").returncode == 0
    stale = out / "rlctl.zsh"
    stale.write_text(stale.read_text().replace("compdef", "compdeff"))
    proc = run("--check")
    assert proc.returncode == 1
    assert "rlctl.zsh" in proc.stderr and "compdeff" in proc.stdout  # names the file, shows the diff
    assert run().returncode == 0 and run("--check").returncode == 0


@pytest.mark.parametrize("shell", SHELLS)
def test_scripts_are_machine_independent(shell):
    text = script(shell)
    assert "_RLCTL_COMPLETE=" in text and "rlctl" in text
    forbidden = {sys.executable, os.path.realpath(sys.executable), str(REPO), os.path.expanduser("~"), "/tmp/"}
    script_path = shutil.which("rlctl")
    if script_path:
        forbidden.add(script_path)
    for item in forbidden:
        if item and item != "/":
            assert item not in text, item
    assert not re.search(r"/(root|home|Users|usr|opt)/", text)
    assert "python" not in text.lower()
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert "\r" not in text


def test_zsh_compdef_first_line():
    assert script("zsh").splitlines()[0] == "#compdef rlctl"


def test_bash_ifs_is_escaped_newline():
    assert "IFS=$'\\n'" in script("bash")


def test_normalise_strips_absolute_paths():
    raw = f"\n\ncomplete -F _f {sys.executable}\nx=/opt/venvs/rl/bin/rlctl  \nlocal IFS=$'\n'\n\n"
    out = gen.normalise(raw, "bash")
    assert sys.executable not in out and "/opt/" not in out
    assert "complete -F _f rlctl\nx=rlctl\nlocal IFS=$'\\n'\n" in out
    assert out.startswith("# rlctl bash completion")


@pytest.mark.parametrize("shell,check", [("bash", ["bash", "-n"]), ("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])])
def test_script_syntax(shell, check):
    if not shutil.which(check[0]):
        pytest.skip(f"{check[0]} not installed")
    proc = subprocess.run([*check, str(COMPLETIONS / f"rlctl.{shell}")], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------- dynamic completion


def test_status_completes_both_run_ids(shim, runs):
    assert sorted(bash_complete(shim, "rlctl status ", 2, runs)) == [RUN_A, RUN_B]


def test_stop_completes_matching_prefix(shim, runs):
    assert bash_complete(shim, "rlctl stop apex", 2, runs) == [RUN_A]
    assert bash_complete(shim, "rlctl stop oth", 2, runs) == [RUN_B]
    assert bash_complete(shim, "rlctl stop zzz", 2, runs) == []


@pytest.mark.parametrize("command", ["logs", "eval"])
def test_other_run_commands_complete_run_ids(shim, runs, command):
    assert sorted(bash_complete(shim, f"rlctl {command} ", 2, runs)) == [RUN_A, RUN_B]


def test_no_runs_dir_completes_nothing(shim, tmp_path):
    assert bash_complete(shim, "rlctl status ", 2, tmp_path / "absent") == []


def test_subcommands_complete(shim, tmp_path):
    assert sorted(bash_complete(shim, "rlctl st", 1, tmp_path)) == ["status", "stop"]
    every = bash_complete(shim, "rlctl ", 1, tmp_path)
    assert {"validate", "plan", "run", "status", "logs", "stop", "eval"} <= set(every)


def test_options_complete(shim, tmp_path):
    assert "--follow" in bash_complete(shim, "rlctl logs --f", 2, tmp_path)


def test_zsh_protocol(shim, runs):
    out = "\n".join(complete(shim, "zsh", {"_TYPER_COMPLETE_ARGS": "rlctl stop apex", "RLCTL_RUNS_DIR": str(runs)}))
    assert RUN_A in out and RUN_B not in out


def test_fish_protocol(shim, runs):
    env = {"_TYPER_COMPLETE_ARGS": "rlctl status ", "_TYPER_COMPLETE_FISH_ACTION": "get-args", "RLCTL_RUNS_DIR": str(runs)}
    out = complete(shim, "fish", env)
    assert {RUN_A, RUN_B} <= {line.split("\t")[0] for line in out}


def test_bash_script_end_to_end(shim, runs):
    """Source the committed bash script and press TAB (call its completion function) with `rlctl` on PATH."""
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("bash not installed")
    program = f"""
source {COMPLETIONS / 'rlctl.bash'}
COMP_WORDS=(rlctl stop apex); COMP_CWORD=2
_rlctl_completion rlctl apex rlctl
printf '%s\\n' "${{COMPREPLY[@]}}"
echo ---
COMP_WORDS=(rlctl status ''); COMP_CWORD=2
_rlctl_completion rlctl '' status
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}", "RLCTL_RUNS_DIR": str(runs)}
    proc = subprocess.run([bash, "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split("---\n")
    assert first.split() == [RUN_A]
    assert sorted(second.split()) == [RUN_A, RUN_B]
