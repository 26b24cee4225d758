"""Reading a job file: TOML -> a validated `JobSpec`, or a `JobFileError` naming the file, each key path
(`replay.alpha`) and its reason, with a "did you mean" suggestion for unknown keys."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rlctl.job.spec import ALGORITHM_NAMES, ALGORITHM_SPECS, JobSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


class JobFileError(Exception):
    """A job file that cannot be used: names the file, the key path and the reason."""

    def __init__(self, path: str | Path, problems: list[tuple[str, str]]):
        self.path = str(path)
        self.problems = problems  # (key path, reason)
        super().__init__(self.render())

    def render(self) -> str:
        """Human-readable, one problem per line."""
        lines = [f"{self.path}: invalid job file"]
        for key, reason in self.problems:
            lines.append(f"  {key or '<file>'}: {reason}" if key else f"  {reason}")
        return "\n".join(lines)


def _key_path(loc: tuple) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif i == 1 and loc[0] == "algorithm" and item in ALGORITHM_NAMES:
            continue  # the discriminator tag pydantic inserts, not a key the user wrote
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The section model a (parent) location points into, for "did you mean" hints."""
    model: Any = JobSpec
    for item in loc:
        if isinstance(item, int):
            continue
        if model is JobSpec and item == "algorithm":
            model = "algorithm"  # the next item is the tag pydantic inserted
            continue
        if model == "algorithm":
            model = ALGORITHM_SPECS.get(item)
            if model is None:
                return None
            continue
        field = getattr(model, "model_fields", {}).get(item)
        if field is None:
            return None
        ann = field.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif inner:
            model = inner[0]
        else:
            return None
    return model


def _reason(err: dict) -> str:
    loc, kind = err["loc"], err["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        known = list(model.model_fields) if model else []
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        suffix = f" (did you mean '{hint[0]}'?)" if hint else (f" (known keys: {', '.join(known)})" if known else "")
        return f"unknown key '{loc[-1]}'{suffix}"
    if kind == "union_tag_invalid":
        return f"unknown algorithm {err.get('ctx', {}).get('tag')!r}; available: {', '.join(ALGORITHM_NAMES)}"
    if kind == "union_tag_not_found":
        return f"missing key 'name' (one of: {', '.join(ALGORITHM_NAMES)})"
    if kind == "missing":
        return "required key is missing"
    msg = err["msg"]
    msg = re.sub(r"^Value error, ", "", msg)
    value = err.get("input")
    if kind not in ("model_type", "dict_type") and not isinstance(value, (dict, list)):
        msg += f" (got {value!r})"
    return msg


def _problem(err: dict) -> tuple[str, str]:
    key, reason = _key_path(err["loc"]), _reason(err)
    if err["type"] == "value_error":
        # Checks across keys write "key.path: reason", relative to the section they validate.
        head, sep, rest = reason.partition(": ")
        if sep and re.fullmatch(r"[\w.\[\]]+(, [\w.\[\]]+)*", head):
            key, reason = (f"{key}.{head}" if key else head), rest
    return key, reason


def validate_job(data: dict, path: str | Path = "<job>") -> JobSpec:
    """Validate parsed TOML into a JobSpec, raising JobFileError with key paths."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(e) for e in exc.errors()]
        raise JobFileError(path, problems) from None


STDIN = "-"  # the job file name that reads the job from standard input


def source_name(path: str | Path) -> str:
    """How messages name a job file: its path, or <stdin> for `-`."""
    return "<stdin>" if str(path) == STDIN else str(path)


def load_job(path: str | Path) -> JobSpec:
    """Read and validate one job file (`-`: standard input)."""
    p = Path(path)
    try:
        text = sys.stdin.read() if str(path) == STDIN else p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobFileError(p, [("", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(source_name(p), [("", f"cannot read: {exc}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(source_name(p), [("", f"not valid TOML: {exc}")]) from None
    return validate_job(data, source_name(p))


def check_entry_points(spec: JobSpec, path: str | Path) -> JobSpec:
    """The job, once every entry point it names (env.id, env.wrappers) loads on this machine; else JobFileError
    naming each key path and why. Imports the user's code: never for a job from a checkpoint file."""
    from rlctl.job.entry_points import entry_point_problems

    problems = entry_point_problems(spec.env)
    if problems:
        raise JobFileError(source_name(path), problems)
    return spec
