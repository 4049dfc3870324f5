"""Reading an experiment file: YAML, the schema, the base trainer config and its overrides, then every check;
and the self-contained form an experiment is stored in."""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hpo.errors import ExperimentFileError
from hpo.experiment.checks import (
    check_file,
    check_spec,
    check_trainer_key,
    check_trainer_value,
    did_you_mean,
    error_line,
    numbers_as_read,
)
from hpo.experiment.schema import ExperimentSpec
from hpo.simulation.table import IN_A_CHECKOUT, TABLES, shipped_table
from search_spaces import shipped_preset
from trainer.config import (
    ConfigError,
    DuplicateKeyError,
    config_from_dict,
    read_yaml,
    set_dotted,
    shipped_config,
    shipped_config_names,
    yaml_error,
)


def load_experiment(path: str | Path, engine: str | None = None) -> ExperimentSpec:
    """Read and validate an experiment file; errors name the file and the dotted field. `engine` validates it as
    if it said `engine: ENGINE` (the CLI's --engine)."""
    bare = "/" not in str(path)  # a name, not a path: it may stand for a shipped preset (`hpo presets` lists them)
    path = shipped_preset(path) or Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        preset = ", and no shipped preset is named so (`hpo presets` lists them)" if bare else ""
        raise ExperimentFileError(f"{path}: the experiment file does not exist{preset}") from None
    except OSError as e:
        raise ExperimentFileError(f"{path}: cannot read the experiment file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ExperimentFileError(f"{path}: {not_utf8(e)}") from None
    try:
        data = read_yaml(text)
    except DuplicateKeyError as e:
        raise ExperimentFileError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ExperimentFileError(f"{path}: {yaml_error(e)}") from None
    if engine is not None and isinstance(data, Mapping):
        data = {**data, "engine": engine}
    spec = experiment_from_dict(data, str(path), base_dir=path.parent)
    check_file(spec, str(path))
    _check_table_file(spec, str(path))
    return spec


def experiment_from_dict(
    data: Any, source: str = "<dict>", base_dir: str | Path | None = None, current_rules: bool = True
) -> ExperimentSpec:
    """Validate a parsed experiment file. Relative base_config paths resolve against `base_dir`
    (default: the directory of `source` when it is a file, else the working directory). `current_rules=False`
    reads a stored experiment as it ran, without the rules of newer versions that it may predate (`check_spec`)."""
    if data is None:
        raise ExperimentFileError(f"{source}: the experiment file is empty: its top level is a mapping of fields "
                                  "(name, base_config, space, budget, ...)")  # fmt: skip
    if not isinstance(data, Mapping):
        raise ExperimentFileError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    if base_dir is None:
        base_dir = Path(source).parent if Path(source).is_file() else Path.cwd()
    try:
        spec = ExperimentSpec.model_validate(_absolute_table(dict(data), Path(base_dir)))
    except ValidationError as e:
        raise ExperimentFileError(_format_validation_error(e, source)) from None
    base = _load_base(spec.base_config, Path(base_dir), source)
    resolved = _apply_overrides(base, spec.overrides, source)
    space = numbers_as_read(spec, resolved) if current_rules else None  # a stored one's trials have its choices
    if space is not None:
        spec = spec.model_copy(update={"space": space})
    check_spec(spec, resolved, source, current_rules)
    spec._source, spec._base = source, resolved
    return spec


def _check_table_file(spec: ExperimentSpec, source: str) -> None:
    """A simulated experiment's curve table is there (an experiment file only: a stored experiment whose table has
    gone is still read, for its report)."""
    simulation = spec.runner.simulation
    if simulation is None or Path(simulation.table).is_file():
        return
    what = "is not a file" if Path(simulation.table).exists() else "does not exist"
    shipped = ", ".join(sorted(p.stem for p in TABLES.glob("*.jsonl")))
    raise ExperimentFileError(
        f"{source}: runner.simulation.table: the curve table {simulation.table} {what} (a relative path is read "
        f"from the experiment file's directory); name a table shipped with hpo ({shipped}) or a JSON lines file "
        f"(`python -m bench.curves.generate` writes one {IN_A_CHECKOUT})"
    )


def _absolute_table(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """`runner.simulation.table` made absolute (it is stored so): a shipped table's name (`curves`) to its file in
    the package, a relative path against the experiment file's directory."""
    runner = data.get("runner")
    simulation = runner.get("simulation") if isinstance(runner, Mapping) else None
    table = simulation.get("table") if isinstance(simulation, Mapping) else None
    if not isinstance(table, str) or Path(table).expanduser().is_absolute():
        return data
    shipped = shipped_table(table)
    absolute = str(shipped if shipped else (base_dir / Path(table)).resolve())
    return {**data, "runner": {**runner, "simulation": {**simulation, "table": absolute}}}


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        msg = e["msg"].removeprefix("Value error, ")
        if e.get("input", ...) is None and e["type"] in _CONTAINER_TYPES:
            msg = _empty(loc)
        elif e["type"] == "search_space":
            loc += [e["ctx"]["key"]] if e["ctx"].get("key") else []
        elif e["type"] == "extra_forbidden":
            msg = f"unknown field{did_you_mean(loc[-1], _fields_at(loc[:-1]))}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{source}: {_dotted(loc)}: {msg}")
    return "\n".join(lines)


def _dotted(loc: list[str]) -> str:
    return ".".join(loc) if loc else "<top level>"


# pydantic's error types for a value that is not the mapping (section) or list a field needs
_CONTAINER_TYPES = ("model_type", "model_attributes_type", "dict_type", "list_type", "search_space")


def _empty(loc: list[str]) -> str:
    """What to say of a section or list given no value (`resources:` with every line under it commented out)."""
    parent = _annotation_at(loc[:-1])
    field = parent.model_fields.get(loc[-1]) if _is_model(parent) and loc else None
    what = "fields" if _is_model(_annotation_at(loc)) else "entries"
    remove = "" if field is None or field.is_required() else ", or remove it to use the defaults"
    return f"empty (nothing under it, or every line under it commented out); give its {what}{remove}"


def _fields_at(loc: list[str]) -> list[str]:
    """The allowed field names of the (nested) section at `loc` of an experiment file."""
    model = _annotation_at(loc)
    return list(model.model_fields) if _is_model(model) else []


def _annotation_at(loc: list[str]) -> Any:
    """The type of the (nested) field at `loc` of an experiment file: through optional sections (`simulation`),
    lists (`machines[0]`) and mappings (`handicaps.<optimizer>`); None where `loc` leads nowhere."""
    annotation: Any = ExperimentSpec
    for part in loc:
        annotation = _section(annotation)
        if _is_model(annotation):
            field = annotation.model_fields.get(part)
            annotation = field.annotation if field else None
        elif typing.get_origin(annotation) in (list, dict):
            annotation = typing.get_args(annotation)[-1]
        else:
            return None
    return _section(annotation)


def _section(annotation: Any) -> Any:
    """`Simulation | None` -> Simulation: the section (or container) type of an optional field."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        nested = [a for a in members if _is_model(a) or typing.get_origin(a) in (list, dict)]
        return nested[0] if len(nested) == 1 else None
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def not_utf8(error: UnicodeDecodeError) -> str:
    """What to say of a file that is not UTF-8 text: where, and what to do."""
    byte = error.object[error.start : error.start + 1].hex()
    return f"not UTF-8 text (byte 0x{byte} at offset {error.start}): save it as UTF-8"


def _load_base(base_config: str | dict[str, Any], base_dir: Path, source: str) -> dict[str, Any]:
    if isinstance(base_config, dict):
        raw, where = copy.deepcopy(base_config), "inline"
    else:
        path = Path(base_config).expanduser()
        path = shipped_config(path, base_dir) or (path if path.is_absolute() else base_dir / path)
        try:
            raw = read_yaml(path.read_text())
        except FileNotFoundError:
            where = "" if Path(base_config).expanduser().is_absolute() else (
                f" (a relative base_config is read from the experiment file's folder, {base_dir}: in a copy of the "
                "file elsewhere, give the path from the copy's folder, an absolute one, or the name of a shipped "
                f"trainer config: {shipped_config_names()})")  # fmt: skip
            raise ExperimentFileError(f"{source}: base_config: file {path} does not exist{where}") from None
        except UnicodeDecodeError as e:
            raise ExperimentFileError(f"{source}: base_config: {path}: {not_utf8(e)}") from None
        except DuplicateKeyError as e:
            raise ExperimentFileError(f"{source}: base_config: {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ExperimentFileError(f"{source}: base_config: {path}: {yaml_error(e)}") from None
        except OSError as e:
            raise ExperimentFileError(f"{source}: base_config: cannot read {path}: {e}") from None
        if raw is None:  # as the trainer refuses such a file: every default (BERT-large) is seldom what was meant
            raise ExperimentFileError(f"{source}: base_config: {path} sets nothing (it is empty, or only comments or "
                                      "null): write {} in it to start from every default (BERT-large), or the keys "
                                      "to set")  # fmt: skip
        where = str(path)
    try:
        config_from_dict(raw, where)
    except ConfigError as e:
        raise ExperimentFileError(f"{source}: base_config: {_indent(str(e))}") from None
    return raw


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _apply_overrides(base: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    resolved = copy.deepcopy(base)
    for key, value in overrides.items():
        check_trainer_key(key, f"overrides.{key}", source)
        check_trainer_value(key, value, f"overrides.{key}", source)
        set_dotted(resolved, key, value)
    try:
        config_from_dict(resolved, "base_config + overrides")
    except ConfigError as e:
        bad = [key for key in overrides if error_line(str(e), key)]
        field = f"overrides.{bad[0]}" if bad else "overrides"
        raise ExperimentFileError(f"{source}: {field}: {_indent(str(e))}") from None
    return resolved


def stored_form(spec: ExperimentSpec, run_dir: str | Path) -> dict[str, Any]:
    """What the experiments table keeps of an experiment: the self-contained spec and its run directory."""
    return {"experiment": spec.self_contained(), "run_dir": str(run_dir)}


def spec_from_stored(record) -> ExperimentSpec:
    """The spec of a stored experiment record (see `stored_form`), read as it ran: without the rules of newer
    versions that it may predate (equal arms)."""
    stored = record.spec.get("experiment") if isinstance(record.spec, Mapping) else None
    return experiment_from_dict(stored, f"experiment {record.name} (stored)", current_rules=False)
