"""Regenerate the shell-completion scripts in this folder from the `rlctl` CLI itself.

    python completions/generate.py            # rewrite rlctl.bash, rlctl.zsh, rlctl.fish
    python completions/generate.py --check    # exit 1 (with a diff) if any of them is out of date

The scripts come from click's shell-completion mechanism as typer wires it: running the CLI with
`_RLCTL_COMPLETE=source_<shell>` prints the script (typer spells the instruction `source_bash`;
plain click spells it `bash_source`, tried second). At TAB time the scripts call `rlctl` again with
`_RLCTL_COMPLETE=complete_<shell>`, so command names, options and run ids (`rlctl status <TAB>`)
always come from the installed CLI; `rlctl` must be on PATH.

Install:
    bash  source completions/rlctl.bash   (or copy it to ~/.local/share/bash-completion/completions/rlctl)
    zsh   source completions/rlctl.zsh    (after `compinit`, e.g. in ~/.zshrc)
    fish  cp completions/rlctl.fish ~/.config/fish/completions/
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROG = "rlctl"
COMPLETE_VAR = "_RLCTL_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
# Run the CLI under its installed name, whatever interpreter or path it is started from.
LAUNCH = f"from rlctl.cli import app; app(prog_name={PROG!r})"
HEADER = "# {prog} {shell} completion: generated from the CLI by completions/generate.py; do not edit.\n"


def file_for(shell: str, folder: Path = HERE) -> Path:
    """Where the script for `shell` lives."""
    return folder / f"{PROG}.{shell}"


def raw_source(shell: str) -> str:
    """The completion script exactly as the CLI prints it."""
    errors = []
    for instruction in (f"source_{shell}", f"{shell}_source"):
        env = {**os.environ, COMPLETE_VAR: instruction}
        proc = subprocess.run([sys.executable, "-c", LAUNCH], env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout
        errors.append(f"{COMPLETE_VAR}={instruction}: exit {proc.returncode}: {proc.stderr.strip()}")
    raise RuntimeError(f"the CLI printed no {shell} completion script:\n  " + "\n  ".join(errors))


def normalise(text: str, shell: str) -> str:
    """Make a script reproducible across machines and readable: no absolute paths, tidy whitespace, a header."""
    # typer's bash template writes `IFS=$'\n'` through a non-raw string, i.e. with a literal newline inside $'...';
    # bash reads both the same, and the escaped form is the readable one.
    text = text.replace("$'\n'", "$'\\n'")
    # Nothing machine-specific: the interpreter, the console script or the checkout never appear, only `rlctl`.
    for path in _machine_paths():
        text = text.replace(path, PROG)
    text = re.sub(r"(?<![\w./~-])/[^\s'\"()]*/" + PROG + r"\b", PROG, text)  # any other absolute path to rlctl
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    header = HEADER.format(prog=PROG, shell=shell)
    if lines and lines[0].startswith("#compdef"):  # zsh wants #compdef on the first line
        return lines[0] + "\n" + header + "\n".join(lines[1:]) + "\n"
    return header + "\n".join(lines) + "\n"


def _machine_paths() -> list[str]:
    found = {sys.executable, os.path.realpath(sys.executable)}
    script = shutil.which(PROG)
    if script:
        found |= {script, os.path.realpath(script)}
    return sorted((p for p in found if p and p != "/"), key=len, reverse=True)


def render(shell: str) -> str:
    """The committed content of the script for `shell`."""
    return normalise(raw_source(shell), shell)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate rlctl's shell-completion scripts from the CLI.")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if any script is out of date.")
    parser.add_argument("--dir", type=Path, default=HERE, help="Folder of the scripts (default: this one).")
    args = parser.parse_args(argv)
    stale = []
    for shell in SHELLS:
        path = file_for(shell, args.dir)
        want = render(shell)
        have = path.read_text(encoding="utf-8") if path.is_file() else None
        if have == want:
            continue
        stale.append(path)
        if args.check:
            diff = difflib.unified_diff((have or "").splitlines(True), want.splitlines(True),
                                        f"{path} (current)", f"{path} (generated)")
            sys.stdout.writelines(diff if have is not None else [f"{path}: missing\n"])
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(f"out of date: {', '.join(str(p) for p in stale)}; run `python completions/generate.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
