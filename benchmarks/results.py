"""A benchmark's result: the last line of its output, one JSON object (DESIGN §5); writing and reading it."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["emit_result", "load_result"]


def load_result(path: Path) -> dict:
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise SystemExit(f"{path}: no JSON result line found")


def emit_result(result: dict, json_out: str | None = None) -> None:
    """Print ``result`` as the last line of the output (and to ``json_out`` if given)."""
    line = json.dumps(result, separators=(",", ":"))
    if json_out:
        Path(json_out).write_text(line + "\n")
    print(line, flush=True)
