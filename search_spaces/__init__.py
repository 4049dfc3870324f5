"""Search spaces over trainer-config keys, their converters (ConfigSpace, NNI) and the preset experiment files.

This package imports nothing of the project. `search_spaces.configspace` is the only module that touches
ConfigSpace; importing the package does not.
"""

from __future__ import annotations

from pathlib import Path

from search_spaces.errors import SearchSpaceError
from search_spaces.space import CategoricalParam, Clause, FloatParam, IntParam, Param, SearchSpace, trainer_key

PRESETS_DIR = Path(__file__).parent / "presets"

__all__ = [
    "PRESETS_DIR",
    "CategoricalParam",
    "Clause",
    "FloatParam",
    "IntParam",
    "Param",
    "SearchSpace",
    "SearchSpaceError",
    "list_presets",
    "preset_path",
    "shipped_preset",
    "unread_namesake",
    "trainer_key",
]


def list_presets() -> list[str]:
    """Names of the shipped preset experiment files (e.g. `adam_vs_lamb`, `adam_vs_lamb_demo_cpu`)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The path of preset experiment file `name` (with or without `.yaml`)."""
    path = PRESETS_DIR / f"{name.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        raise SearchSpaceError(None, f"no preset named {name!r}; presets: {', '.join(list_presets())}")
    return path


def shipped_preset(path: str | Path) -> Path | None:
    """The shipped preset a bare name stands for (`adam_vs_lamb_simulated`, with or without `.yaml`), where no file
    of that name is at hand; None for anything else (a path with a folder in it, an existing file, no such preset)."""
    if "/" in str(path) or Path(path).exists():  # `./name` is a path, and a file at hand comes first
        return None
    found = PRESETS_DIR / f"{str(path).removesuffix('.yaml')}.yaml"
    return found if found.is_file() else None


def unread_namesake(path: str | Path) -> Path | None:
    """`NAME.yaml` in the working folder where a bare NAME stands for the shipped preset of that name (the preset is
    read, this file is not: the CLI says so); None where there is no such file or NAME is not a shipped preset."""
    if shipped_preset(path) is None or str(path).endswith(".yaml"):
        return None
    namesake = Path(f"{path}.yaml")
    return namesake if namesake.is_file() else None
