"""The console every command prints through: rich's, as wide as a terminal on a terminal, and on anything else (a
file, a pipe, a CI log, a pipeline task's log) wide enough for any line it prints, so plain output never wraps a line
(a path or a figure split over two lines is what grep misses) and never cuts a table cell with an ellipsis (rich sizes
a table to the console's width, 80 columns when it cannot ask a terminal). COLUMNS, when set, still decides."""

from __future__ import annotations

import os
from typing import Any

# what "wide enough" means for plain output: far wider than any line or table we print; rich's tables keep their
# natural width (nothing here expands to the console's width)
PLAIN_WIDTH = 4096


def make_console(*, stderr: bool = False, min_width: int = 0, **kwargs: Any):
    """A `rich.console.Console` (stderr, file, ... as rich takes them) that does not wrap plain output (see the module).
    min_width: a terminal narrower than this still gets it (a wide table then runs past the terminal's edge rather
    than being cut; the benchmarks' tables and `sdar size` ask for it)."""
    from rich.console import Console

    console = Console(stderr=stderr, **kwargs)
    if not console.is_terminal and "width" not in kwargs and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, width=PLAIN_WIDTH, **kwargs)
    elif "width" not in kwargs and console.width < min_width:
        console = Console(stderr=stderr, width=min_width, **kwargs)
    return console
