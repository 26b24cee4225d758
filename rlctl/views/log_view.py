"""`rlctl logs`: one line of a run's logs for people (time, process, text; the prefix coloured by role) or as one
JSON object for code."""

from __future__ import annotations

import json
import sys
import time
import zlib
from typing import TYPE_CHECKING

from rlctl.views.console import get_console

if TYPE_CHECKING:
    from rich.text import Text

ROLE_PALETTE = ("cyan", "green", "yellow", "magenta", "blue", "bright_cyan", "bright_green", "bright_magenta")


def _role_of(source: str) -> str:
    """Role part of a source name ("collector-3" -> "collector")."""
    role, sep, rank = source.rpartition("-")
    return role if sep and rank.isdigit() else source


def role_colour(source: str) -> str:
    """Stable palette colour for a source's role (same role -> same colour, in every process)."""
    # zlib.crc32, not hash(): str hashes are randomised per interpreter.
    return ROLE_PALETTE[zlib.crc32(_role_of(source).encode()) % len(ROLE_PALETTE)]


def _clock(ts: float) -> str:
    """Local "HH:MM:SS.mmm" of an epoch time."""
    try:
        millis = int((ts % 1) * 1000)
        return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{millis:03d}"
    except (OverflowError, OSError, ValueError, TypeError):
        return "??:??:??.???"


def log_line_markup(source: str, text: str, ts: float, source_width: int = 0) -> "Text":
    """Log line as rich Text: "HH:MM:SS.mmm source | text", prefix coloured by role; text never markup."""
    from rich.text import Text

    line = Text(f"{_clock(ts)} {source:<{source_width}} | ", style=role_colour(source))
    # Process output may carry its own ANSI colours; decode those rather than printing escapes.
    line.append_text(Text.from_ansi(text) if "\x1b" in text else Text(text))
    return line


def log_printer(as_json: bool = False):
    """A function that prints one log entry (ts, source, text): as a coloured line, or as one JSON object."""
    if as_json:
        def show(entry: tuple[float, str, str]) -> None:
            ts, source, text = entry
            sys.stdout.write(json.dumps({"ts": round(ts, 3), "source": source, "text": text}) + "\n")
            sys.stdout.flush()
        return show
    con = get_console()
    # One entry, one output line at any width: `--tail N`, grep and the terminal's own wrapping rely on it.
    return lambda entry: con.print(log_line_markup(entry[1], entry[2], entry[0]), soft_wrap=True)
