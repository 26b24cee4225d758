"""Shipped job files rewritten for a test: the one helper every end-to-end test uses (no file keeps its own)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shipped_job(directory: Path, job: str, *, name: str | None = None, stop: str | None = None,
                wall_s: float | None = None, drop: tuple[str, ...] = (), drop_sections: tuple[str, ...] = (),
                add: dict[str, str] | None = None, extra: str = "", file_name: str | None = None,
                **replace: object) -> Path:
    """jobs/<job>.toml written to `directory` with, in this order: the [job.stop] table's body replaced by `stop`
    (plus `wall_s`), or only its wall_s line set; the first `name = ...` line set to `name`; every `key = ...` line of
    `drop` removed; each table of `drop_sections` removed; each `key = value` of `replace` set (a key that is not
    exactly once in the file fails the test: the shipped job changed); `add`'s lines put first in their table
    ({"topology": "max_restarts = 0"}); `extra` appended."""
    text = (REPO / "jobs" / f"{job}.toml").read_text()
    if stop is not None:
        body = stop + (f"\nwall_s = {wall_s}" if wall_s is not None else "")
        text, n = re.subn(r"(?ms)^\[job\.stop\]\n.*?(?=^\[)", f"[job.stop]\n{body}\n\n", text)
        assert n == 1, "no [job.stop] table"
    elif wall_s is not None:
        text, n = re.subn(r"(?m)^wall_s = .*$", f"wall_s = {wall_s}", text)
        assert n == 1, "no wall_s line"
    if name is not None:
        text = re.sub(r"(?m)^name = .*$", f'name = "{name}"', text, count=1)
    for key in drop:
        text = re.sub(rf"(?m)^{key} = .*\n", "", text)
    for section in drop_sections:
        text = re.sub(rf"(?ms)^\[{re.escape(section)}\]\n.*?(?=^\[|\Z)", "", text)
    for key, value in replace.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, f"{key}: {n} lines in jobs/{job}.toml"
    for table, lines in (add or {}).items():
        assert f"[{table}]\n" in text, f"no [{table}] table in jobs/{job}.toml"
        text = text.replace(f"[{table}]\n", f"[{table}]\n{lines.rstrip()}\n", 1)
    path = Path(directory) / (file_name or f"{name or job}.toml")
    path.write_text(text + extra)
    return path
