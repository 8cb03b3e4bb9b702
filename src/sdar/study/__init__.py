"""The evidence study: arms x seeds x families as one resumable job (`sdar study`), and its analysis."""

from sdar.study.spec import Cell, StudySpec, load_spec, parse_spec

__all__ = ["Cell", "StudySpec", "load_spec", "parse_spec"]
