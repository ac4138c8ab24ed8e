"""Reading a benchmark's result: the last line of its output that parses as a JSON object (DESIGN §5)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["load_result"]


def load_result(path: Path) -> dict:
    for line in reversed(path.read_text().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise SystemExit(f"{path}: no JSON result line found")
