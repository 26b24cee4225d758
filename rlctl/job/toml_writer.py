"""A small TOML writer for the job data rlctl writes back (job.toml of a run, sbatch jobs, `rlctl init`): tables,
arrays of tables, strings, numbers, booleans and arrays; anything else is an error."""

from __future__ import annotations

import re
from typing import Any


def dumps_toml(data: dict) -> str:
    """Serialize nested plain data (as made by resolved_dict) to TOML."""
    lines: list[str] = []
    _emit_table(data, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + _TOML_ESCAPE_RE.sub(_toml_escape, v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


# A TOML basic string must escape `"`, backslash and every control character but tab.
_TOML_ESCAPE_RE = re.compile(r'["\\\x00-\x08\x0a-\x1f\x7f]')


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def _toml_escape(m: re.Match) -> str:
    ch = m.group()
    return _TOML_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _emit_table(data: dict, prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if not _is_table(v) and not _is_table_array(v)}
    if prefix and (scalars or not data):
        lines.append("")
        lines.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
    for k, v in scalars.items():
        lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in data.items():
        if _is_table(v):
            _emit_table(v, prefix + [k], lines)
        elif _is_table_array(v):
            for item in v:
                lines.append("")
                lines.append("[[" + ".".join(_toml_key(p) for p in prefix + [k]) + "]]")
                for ik, iv in item.items():
                    lines.append(f"{_toml_key(ik)} = {_toml_value(iv)}")


def _is_table(v: Any) -> bool:
    # Empty maps stay inline (`kwargs = {}`); every other map is a [section], which TOML reads back identically.
    return isinstance(v, dict) and bool(v)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)
