"""Code a job names by entry point (`env.id = "module:attr"`, `env.wrappers`): loaded by name where envs are made,
and checked by `rlctl validate` (and `rlctl run` of a job that runs on this machine) before anything starts.

The schema checks only their form (rlctl.job.spec): validating a checkpoint's stored job must import nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, Iterator


class EntryPointError(ValueError):
    """An entry point that cannot be loaded here; the message is one line."""


def one_line(exc: BaseException) -> str:
    """An exception as `Type: message` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_entry_point(name: str) -> Any:
    """The callable `module:attr` names; EntryPointError saying why it cannot be had (the module's own import errors
    included: importing it runs its code)."""
    module, _, attr = name.partition(":")
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # the module's own code runs: any error
        raise EntryPointError(f"cannot import module {module!r} ({one_line(exc)})") from None
    try:
        found = getattr(loaded, attr)
    except AttributeError:
        raise EntryPointError(f"module {module!r} has no attribute {attr!r}") from None
    if not callable(found):
        raise EntryPointError(f"{attr!r} is a {type(found).__name__}, not a class or function")
    return found


@contextlib.contextmanager
def _importable_from_cwd() -> Iterator[None]:
    # Role processes run as `python -m ...` in this directory, which puts it on their path; the `rlctl` script's
    # own path lacks it. Checked as they will load it.
    added = "" not in sys.path and os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())


def entry_point_problems(env) -> list[tuple[str, str]]:
    """(key path, reason) for each entry point of an [env] section (an EnvSpec) that cannot be loaded here."""
    named = [("env.id", env.id)] if ":" in env.id else []
    named += [(f"env.wrappers[{i}]", w.name) for i, w in enumerate(env.wrappers)]
    problems = []
    with _importable_from_cwd():
        for key, name in named:
            try:
                load_entry_point(name)
            except EntryPointError as exc:
                problems.append((key, f"{name!r}: {exc}"))
    return problems
