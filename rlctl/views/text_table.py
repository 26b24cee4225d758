"""A table laid out by character counts, for the CLI's tables (runs, processes, hosts, compare).

rich's Table measures and wraps every cell through its layout engine: for a hundred runs that was most of
`rlctl status`'s time. These tables never wrap a cell, so the layout is arithmetic: each column is as wide as its
widest cell, free-text columns (a note) shrink to what is left and end in "…"; a line still wider than the screen
ends in "…" rather than being cropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement
    from rich.text import Text

GAP = "  "  # between columns


def line_width(widths: list[int]) -> int:
    """Characters of a line whose columns are this wide, gaps included."""
    return sum(widths) + len(GAP) * max(0, len(widths) - 1)


@dataclass
class TextTable:
    """Columns of one-line cells: a title, a bold header, a rule, one line per row."""

    title: str | None
    columns: list[str]
    rows: list[list["Text"]]  # every row as long as columns
    right: list[bool]  # right-justified (numeric) columns
    free: list[bool]  # columns that shrink to fit, cut with "…"

    def widths(self) -> list[int]:
        """Each column's natural width: its header or its widest cell."""
        return [max([len(name), *(row[i].cell_len for row in self.rows)]) for i, name in enumerate(self.columns)]

    def least_width(self) -> int:
        """Characters a line needs at the least: free-text columns shrunk to their header."""
        widths = [len(name) if free else w for name, free, w in zip(self.columns, self.free, self.widths())]
        return line_width(widths)

    def fitted_widths(self, max_width: int) -> list[int]:
        """Natural widths, the free-text columns cut (no lower than their header) until a line fits max_width."""
        widths = self.widths()
        excess = line_width(widths) - max_width
        for i in range(len(widths)):
            if excess <= 0:
                break
            if self.free[i]:
                cut = min(excess, widths[i] - len(self.columns[i]))
                widths[i] -= cut
                excess -= cut
        return widths

    def __rich_measure__(self, console: "Console", options: "ConsoleOptions") -> "Measurement":
        from rich.measure import Measurement

        return Measurement(self.least_width(), line_width(self.widths()))

    def __rich_console__(self, console: "Console", options: "ConsoleOptions") -> "RenderResult":
        from rich.segment import Segment
        from rich.text import Text

        widths = self.fitted_widths(options.max_width)
        if self.title:
            yield Segment(self.title, console.get_style("table.title"))
            yield Segment.line()
        header = [Text(name, style="bold") for name in self.columns]
        for cells in (header, *self.rows):
            line = Text(no_wrap=True, end="")
            for i, (cell, width) in enumerate(zip(cells, widths)):
                if i:
                    line.append(GAP)
                if cell.cell_len > width:
                    cell = cell.copy()
                    cell.truncate(width, overflow="ellipsis")
                pad = " " * (width - cell.cell_len)
                if self.right[i]:
                    line.append(pad)
                    line.append_text(cell)
                elif i < len(cells) - 1:  # no trailing spaces after the last column
                    line.append_text(cell)
                    line.append(pad)
                else:
                    line.append_text(cell)
            if line.cell_len > options.max_width:  # wider than the screen after all: say so, never crop silently
                line.truncate(options.max_width, overflow="ellipsis")
            yield from line.render(console)
            yield Segment.line()
            if cells is header:
                yield Segment("─" * min(line_width(widths), options.max_width), console.get_style("table.header"))
                yield Segment.line()


def text_cell(cell: Any) -> "Text":
    """A cell as one line of rich Text: strings are plain text (never markup), None is a dim "-"."""
    from rich.text import Text

    if cell is None:
        return Text("-", style="dim")
    if isinstance(cell, Text):
        return cell
    return Text(str(cell).replace("\n", " "))
