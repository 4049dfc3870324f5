"""What a result directory's system description says about a run's hardware: MLCommons' layout keeps
`<submitter>/systems/<system>.json` beside `<submitter>/results/<system>/`, with the number of nodes and of
accelerators per node, from which a run's accelerator-hours follow."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class System:
    """What the result directory's system description says (None where it says nothing)."""

    accelerators: int | None  # number_of_nodes x accelerators_per_node
    accelerator: str | None  # accelerator_model_name
    file: Path | None  # the description read (None: none found)
    note: str | None = None  # why there is no accelerator count


def system_description(path: Path) -> System:
    """The accelerators of a result file's system: `<submitter>/systems/<system>.json` for a file under
    `<submitter>/results/<system>/...` (MLCommons' layout). A missing or unreadable description, or one without both
    counts, is no count (with a note): the run itself is read as it is."""
    parts = path.resolve().parts
    if "results" not in parts[:-1]:
        return System(None, None, None)
    at = len(parts) - 2 - parts[:-1][::-1].index("results")
    if at + 1 >= len(parts) - 1:
        return System(None, None, None)
    file = Path(*parts[:at], "systems", f"{parts[at + 1]}.json")
    if not file.is_file():
        return System(None, None, None, f"no system description {file}")
    try:
        data = json.loads(_text(file.read_bytes()))
    except (OSError, json.JSONDecodeError) as e:
        return System(None, None, file, f"{file}: not readable JSON ({getattr(e, 'msg', e)})")
    data = data if isinstance(data, dict) else {}
    nodes, per_node = _count(data.get("number_of_nodes")), _count(data.get("accelerators_per_node"))
    model = data.get("accelerator_model_name")
    model = (str(model).strip() or None) if model is not None else None
    if nodes is None or per_node is None:
        said = ", ".join(f"{key} {data.get(key)!r}" for key in ("number_of_nodes", "accelerators_per_node"))
        return System(None, model, file, f"{file}: {said}: no accelerator count")
    return System(nodes * per_node, model, file)


def _text(data: bytes) -> str:
    """A description's text as result files are read: UTF-8 after a byte order mark, if any, else Latin-1 (a
    description saved by an editor in a Windows code page: `Intel\xae`)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _count(value: Any) -> int | None:
    """A positive whole count as system descriptions write it ("128", 4, 1.0); None otherwise."""
    with contextlib.suppress(TypeError, ValueError):
        number = float(str(value).strip())
        if number.is_integer() and number > 0:
            return int(number)
    return None
