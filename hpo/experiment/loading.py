"""Reading an experiment file: YAML, the schema, the base trainer config and its overrides, then every check;
and the self-contained form an experiment is stored in."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hpo.errors import ExperimentFileError
from hpo.experiment.checks import check_spec, check_trainer_key, did_you_mean, error_line
from hpo.experiment.schema import ExperimentSpec
from hpo.simulation.table import shipped_table
from trainer.config import ConfigError, config_from_dict, set_dotted


def load_experiment(path: str | Path) -> ExperimentSpec:
    """Read and validate an experiment file; errors name the file and the dotted field."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ExperimentFileError(f"{path}: the experiment file does not exist") from None
    except OSError as e:
        raise ExperimentFileError(f"{path}: cannot read the experiment file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ExperimentFileError(f"{path}: {not_utf8(e)}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ExperimentFileError(f"{path}: {_yaml_where(e)}not valid YAML ({_yaml_problem(e)})") from None
    return experiment_from_dict(data, str(path), base_dir=path.parent)


def experiment_from_dict(
    data: Any, source: str = "<dict>", base_dir: str | Path | None = None, check_arms: bool = True
) -> ExperimentSpec:
    """Validate a parsed experiment file. Relative base_config paths resolve against `base_dir`
    (default: the directory of `source` when it is a file, else the working directory). `check_arms=False`
    reads a stored experiment as it ran, without the equal-arms rule of newer versions."""
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
    check_spec(spec, resolved, source, check_arms)
    spec._source, spec._base = source, resolved
    return spec


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


def _yaml_where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    return getattr(e, "problem", None) or str(e).splitlines()[0]


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "search_space":
            loc += [e["ctx"]["key"]] if e["ctx"].get("key") else []
        elif e["type"] == "extra_forbidden":
            msg = f"unknown field{did_you_mean(loc[-1], _fields_at(loc[:-1]))}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{source}: {_dotted(loc)}: {msg}")
    return "\n".join(lines)


def _dotted(loc: list[str]) -> str:
    return ".".join(loc) if loc else "<top level>"


def _fields_at(loc: list[str]) -> list[str]:
    """The allowed field names of the (nested) section at `loc` of an experiment file."""
    model: Any = ExperimentSpec
    for part in loc:
        model = model.model_fields[part].annotation if part in getattr(model, "model_fields", {}) else None
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def not_utf8(error: UnicodeDecodeError) -> str:
    """What to say of a file that is not UTF-8 text: where, and what to do."""
    byte = error.object[error.start : error.start + 1].hex()
    return f"not UTF-8 text (byte 0x{byte} at offset {error.start}): save it as UTF-8"


def _load_base(base_config: str | dict[str, Any], base_dir: Path, source: str) -> dict[str, Any]:
    if isinstance(base_config, dict):
        raw, where = copy.deepcopy(base_config), "inline"
    else:
        path = Path(base_config).expanduser()
        path = path if path.is_absolute() else base_dir / path
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ExperimentFileError(f"{source}: base_config: file {path} does not exist") from None
        except UnicodeDecodeError as e:
            raise ExperimentFileError(f"{source}: base_config: {path}: {not_utf8(e)}") from None
        except (OSError, yaml.YAMLError) as e:
            raise ExperimentFileError(f"{source}: base_config: cannot read {path}: {e}") from None
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
    return experiment_from_dict(stored, f"experiment {record.name} (stored)", check_arms=False)
