"""A typed search space over dotted trainer-config keys, with conditions, and its YAML form.

Parameters are named by dotted trainer keys (`optimizer.lr`). Three kinds:

    optimizer.name:        {choice: [adamw, lamb]}
    optimizer.lr:          {float: [1.0e-4, 5.0e-3], log: true}
    schedule.warmup_steps: {int: [0, 200]}             # both bounds inclusive

Numbers such as `1e-3` and `1.0e3`, which YAML 1.1 (PyYAML) reads as strings, are numbers in ranges, choices and
conditions. A choice list holds each value once, and `true` and `1` (`false` and `0`) count as one value.

A parameter may carry a `when` condition on categorical parameters of the same space; it is *active* (sampled,
sent to the trainer) only when every clause holds, and absent otherwise (the trainer then keeps its base value):

    when: {optimizer.name: lamb}                        # equality
    when: {clipping.strategy: {not: none}}              # inequality; {not: [a, b]} excludes several values
    when: {optimizer.name: {in: [adamw, lamb]}}         # membership
    when: {optimizer.name: lamb, clipping.strategy: {not: none}}   # several keys: all must hold

A clause on a parameter that is itself inactive is false, as in ConfigSpace.

Arm-specific ranges: a parameter name may carry a label after `@`; `optimizer.lr@lamb` and `optimizer.lr@adamw`
are two tuner parameters (with their own ranges) that both set the trainer key `optimizer.lr`. Parameters that set
the same trainer key must have `when` conditions that can never hold together, so at most one is active:

    optimizer.lr@lamb:  {float: [3.0e-4, 5.0e-3], log: true, when: {optimizer.name: lamb}}
    optimizer.lr@adamw: {float: [1.0e-4, 2.0e-3], log: true, when: {optimizer.name: adamw}}

Configurations (from `sample`, ConfigSpace or NNI) are keyed by parameter *names*; `trainer_values` maps them to
trainer keys. Only names appear in ConfigSpace and NNI, so both converters stay one-to-one.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import math
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from search_spaces.errors import SearchSpaceError

Scalar = str | int | float | bool

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(@[\w.-]+)?")  # the whole name (fullmatch)
_KINDS = ("choice", "float", "int")
_PARAM_FIELDS = {*_KINDS, "log", "when"}
# A number with an exponent that YAML 1.1 (PyYAML) leaves as a string: no dot or no sign (1e-3, 1.0e3).
_EXPONENT_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans apart from numbers (True == 1 in Python, not in a search space)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _among(value: Any, values: tuple[Scalar, ...]) -> bool:
    return any(_same(value, v) for v in values)


def trainer_key(name: str) -> str:
    """The trainer-config key a parameter sets: its name without the `@label`."""
    return name.split("@", 1)[0]


# ------------------------------------------------------------------------------------------------ conditions
@dataclass(frozen=True)
class Clause:
    """One condition on a categorical parameter `key`: equal to, not among, or among `values`."""

    key: str
    op: Literal["eq", "not", "in"]
    values: tuple[Scalar, ...]

    def holds(self, value: Any) -> bool:
        """Whether the parent's value satisfies this clause."""
        return _among(value, self.values) != (self.op == "not")

    def to_yaml(self) -> Any:
        """The YAML form of the clause's right-hand side."""
        if self.op == "eq":
            return self.values[0]
        if self.op == "not":
            return {"not": self.values[0] if len(self.values) == 1 else list(self.values)}
        return {"in": list(self.values)}

    @staticmethod
    def parse(key: str, spec: Any) -> Clause:
        """Read `value`, `{not: value}`, `{not: [values]}` or `{in: [values]}`."""
        if not isinstance(spec, Mapping):
            return Clause(key, "eq", (_scalar(_yaml_number(spec), f"when.{key}"),))
        if len(spec) != 1 or next(iter(spec)) not in ("not", "in"):
            raise SearchSpaceError(None, f"when.{key}: expected a value, {{not: value}} or {{in: [values]}}")
        op, raw = next(iter(spec.items()))
        if op == "in" and not isinstance(raw, list):
            raise SearchSpaceError(None, f"when.{key}.in: expected a list of values, got {raw!r}")
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise SearchSpaceError(None, f"when.{key}.{op}: the list of values is empty")
        return Clause(key, op, tuple(_scalar(_yaml_number(v), f"when.{key}.{op}") for v in items))


def _yaml_number(value: Any) -> Any:
    """A choice or condition value: `1e-3`, which YAML 1.1 leaves as a string, read as the number it is."""
    return float(value) if isinstance(value, str) and _EXPONENT_NUMBER.match(value) else value


def _scalar(value: Any, where: str) -> Scalar:
    if isinstance(value, float) and not math.isfinite(value):
        raise SearchSpaceError(None, f"{where}: {value!r} is not a finite number")
    if not isinstance(value, (str, int, float, bool)):
        raise SearchSpaceError(None, f"{where}: {value!r} is not a string, number or boolean")
    return value


# ------------------------------------------------------------------------------------------------ parameters
def _bound(value: Any, integer: bool, where: str) -> float | int:
    """A range bound; numeric strings such as '5e-3' (which YAML 1.1 leaves as strings) are read as numbers, and
    an integer bound may be written as a whole float (1e3, 4.0, '4')."""
    number = value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if integer and isinstance(number, float) and number.is_integer():
        number = int(number)
    kind = int if integer else (int, float)
    if isinstance(number, bool) or not isinstance(number, kind) or not math.isfinite(number):
        raise SearchSpaceError(None, f"{where}: {value!r} is not {'an integer' if integer else 'a finite number'}")
    return number


def _check_range(low: float, high: float, log: bool) -> None:
    if not low < high:
        raise SearchSpaceError(None, f"low must be < high (got [{low}, {high}])")
    if log and low <= 0:
        raise SearchSpaceError(None, f"a log range needs low > 0 (got [{low}, {high}])")


@dataclass(frozen=True)
class FloatParam:
    """A real number in [low, high], uniform or (log=True) log-uniform."""

    low: float
    high: float
    log: bool = False
    when: tuple[Clause, ...] = ()

    def __post_init__(self) -> None:
        _check_range(self.low, self.high, self.log)

    def sample(self, rng: random.Random) -> float:
        if self.log:
            return min(max(math.exp(rng.uniform(math.log(self.low), math.log(self.high))), self.low), self.high)
        return rng.uniform(self.low, self.high)

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high


@dataclass(frozen=True)
class IntParam:
    """An integer in [low, high] (both inclusive), uniform or (log=True) log-uniform."""

    low: int
    high: int
    log: bool = False
    when: tuple[Clause, ...] = ()

    def __post_init__(self) -> None:
        _check_range(self.low, self.high, self.log)

    def sample(self, rng: random.Random) -> int:
        if self.log:
            value = round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return min(max(value, self.low), self.high)
        return rng.randint(self.low, self.high)

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high


@dataclass(frozen=True)
class CategoricalParam:
    """One of a list of choices (strings, numbers or booleans); only these can be the target of conditions."""

    choices: tuple[Scalar, ...]
    when: tuple[Clause, ...] = ()

    def __post_init__(self) -> None:
        if not self.choices:
            raise SearchSpaceError(None, "choice: the list of choices is empty")
        for i, value in enumerate(self.choices):
            _scalar(value, "choice")
            if _among(value, self.choices[:i]):
                raise SearchSpaceError(None, f"choice: {value!r} is listed twice")
            equal = next((v for v in self.choices[:i] if v == value), None)
            if equal is not None:  # true and 1, false and 0: one value to ConfigSpace and to the trainer
                raise SearchSpaceError(None, f"choice: {equal!r} and {value!r} are the same choice (true is 1, "
                                             "false is 0); keep one")  # fmt: skip

    def sample(self, rng: random.Random) -> Scalar:
        return rng.choice(self.choices)

    def contains(self, value: Any) -> bool:
        return _among(value, self.choices)


Param = FloatParam | IntParam | CategoricalParam


def param_from_dict(spec: Any) -> Param:
    """Read one parameter's YAML form ({choice: [...]} | {float: [lo, hi]} | {int: [lo, hi]}, log, when)."""
    if not isinstance(spec, Mapping):
        raise SearchSpaceError(None, f"expected a mapping such as {{float: [low, high]}}, got {spec!r}")
    unknown = sorted(set(spec) - _PARAM_FIELDS, key=str)
    if unknown:
        raise SearchSpaceError(None, f"unknown field {unknown[0]!r} (expected one of choice, float, int, log, when)")
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        raise SearchSpaceError(None, "give exactly one of choice: [...], float: [low, high] or int: [low, high]")
    if "when" in spec and spec["when"] is None:
        raise SearchSpaceError(None, "when: empty (nothing under it, or every line under it commented out); give "
                                     "{parameter: value}, or remove it")  # fmt: skip
    kind, when = kinds[0], _parse_when(spec.get("when"))
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SearchSpaceError(None, f"log: expected true or false, got {log!r}")
    if kind == "choice":
        if log:
            raise SearchSpaceError(None, "log: only float and int parameters have a log scale")
        if not isinstance(spec["choice"], list):
            raise SearchSpaceError(None, f"choice: expected a list of values, got {spec['choice']!r}")
        return CategoricalParam(tuple(_yaml_number(v) for v in spec["choice"]), when)
    bounds = spec[kind]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise SearchSpaceError(None, f"{kind}: expected [low, high], got {bounds!r}")
    low, high = (_bound(b, kind == "int", kind) for b in bounds)
    return FloatParam(float(low), float(high), log, when) if kind == "float" else IntParam(low, high, log, when)


def _parse_when(spec: Any) -> tuple[Clause, ...]:
    if spec is None:
        return ()
    if not isinstance(spec, Mapping) or not spec:
        raise SearchSpaceError(None, f"when: expected a mapping {{parameter: value}}, got {spec!r}")
    return tuple(Clause.parse(str(key), value) for key, value in spec.items())


def param_to_dict(param: Param) -> dict[str, Any]:
    """The YAML form of one parameter (inverse of `param_from_dict`)."""
    if isinstance(param, CategoricalParam):
        out: dict[str, Any] = {"choice": list(param.choices)}
    else:
        out = {"float" if isinstance(param, FloatParam) else "int": [param.low, param.high]}
        if param.log:
            out["log"] = True
    if param.when:
        out["when"] = {c.key: c.to_yaml() for c in param.when}
    return out


# ------------------------------------------------------------------------------------------------ the space
@dataclass(frozen=True)
class SearchSpace:
    """Named parameters with conditions; validated on construction (raises `SearchSpaceError`)."""

    params: Mapping[str, Param]
    order: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params))
        for name, param in self.params.items():
            self._check_name(name)
            for clause in param.when:
                self._check_clause(name, clause)
        object.__setattr__(self, "order", self._topological_order())
        self._check_exclusive_variants()

    @classmethod
    def from_dict(cls, data: Any) -> SearchSpace:
        """Build a space from its YAML form: a mapping of parameter name -> parameter spec."""
        if not isinstance(data, Mapping) or not data:
            raise SearchSpaceError(None, f"expected a non-empty mapping of parameter name -> spec, got {data!r}")
        params = {}
        for name, spec in data.items():
            try:
                params[str(name)] = param_from_dict(spec)
            except SearchSpaceError as e:
                raise SearchSpaceError(str(name), e.reason) from None
        return cls(params)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The YAML form (inverse of `from_dict`)."""
        return {name: param_to_dict(param) for name, param in self.params.items()}

    # -- mapping protocol: names in topological order (every parameter after those its condition reads)
    def __getitem__(self, name: str) -> Param:
        return self.params[name]

    def __contains__(self, name: object) -> bool:
        return name in self.params

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.params)

    @property
    def names(self) -> list[str]:
        """Parameter names, parents before the parameters conditioned on them."""
        return list(self.order)

    def is_active(self, name: str, config: Mapping[str, Any]) -> bool:
        """Whether parameter `name` is active given the values in `config` (its parents must be active too)."""
        for clause in self.params[name].when:
            if clause.key not in config or not self.is_active(clause.key, config):
                return False
            if not clause.holds(config[clause.key]):
                return False
        return True

    def sample(self, rng: random.Random | int | None = None) -> dict[str, Any]:
        """A random configuration: active parameters only, keyed by name."""
        rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        config: dict[str, Any] = {}
        for name in self.order:
            if self.is_active(name, config):
                config[name] = self.params[name].sample(rng)
        return config

    def as_read_now(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Stored parameters as this space reads its choices: a choice stored as the string `"1e-3"` (as spaces
        read before numbers with an exponent were read as numbers) is the number it names."""
        read = dict(params)
        for name, value in params.items():
            param = self.params.get(name)
            if isinstance(param, CategoricalParam) and not _among(value, param.choices):
                number = _yaml_number(value)
                if number is not value and _among(number, param.choices):
                    read[name] = number
        return read

    def validate_params(self, config: Mapping[str, Any]) -> None:
        """Raise `SearchSpaceError` unless `config` has exactly the active parameters, each within its range."""
        for name in config:
            if name not in self.params:
                raise SearchSpaceError(name, f"not a parameter of the space{self._did_you_mean(name)}")
        for name in self.order:
            active = self.is_active(name, config)
            if active and name not in config:
                raise SearchSpaceError(name, "is active but has no value")
            if not active and name in config:
                raise SearchSpaceError(name, "has a value but its condition is false")
            if active and not self.params[name].contains(config[name]):
                raise SearchSpaceError(name, f"value {config[name]!r} is outside {param_to_dict(self.params[name])}")

    def trainer_values(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Map a configuration keyed by parameter names to trainer keys (`optimizer.lr@lamb` -> `optimizer.lr`)."""
        return {trainer_key(name): value for name, value in config.items()}

    # -- validation
    def _did_you_mean(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.params), n=1)
        return f" (did you mean {close[0]!r}?)" if close else ""

    @staticmethod
    def _check_name(name: str) -> None:
        if not _NAME.fullmatch(name):
            raise SearchSpaceError(name, "not a dotted key such as optimizer.lr (optionally with an @label)")

    def _check_clause(self, name: str, clause: Clause) -> None:
        parent = self.params.get(clause.key)
        if clause.key == name:
            raise SearchSpaceError(name, "when: a parameter cannot depend on itself")
        if parent is None:
            known = f"{self._did_you_mean(clause.key)}; conditions refer to categorical parameters of the space"
            raise SearchSpaceError(name, f"when: {clause.key!r} is not a parameter of the space{known}")
        if not isinstance(parent, CategoricalParam):
            raise SearchSpaceError(name, f"when: {clause.key!r} is not categorical; conditions need a choice")
        for value in clause.values:
            if not parent.contains(value):
                raise SearchSpaceError(
                    name, f"when: {value!r} is not among the choices of {clause.key} {list(parent.choices)}"
                )
        if not any(clause.holds(v) for v in parent.choices):
            raise SearchSpaceError(name, f"when: the condition on {clause.key} can never hold")

    def _topological_order(self) -> tuple[str, ...]:
        order: list[str] = []
        state: dict[str, str] = {}  # name -> "visiting" | "done"

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                cycle = " -> ".join([*path[path.index(name) :], name])
                raise SearchSpaceError(name, f"when: conditions form a cycle ({cycle})")
            state[name] = "visiting"
            for clause in self.params[name].when:
                visit(clause.key, [*path, name])
            state[name] = "done"
            order.append(name)

        for name in self.params:
            visit(name, [])
        return tuple(order)

    def _ancestors(self, names: list[str]) -> list[str]:
        """The categorical parameters that the activity of `names` depends on, in topological order."""
        found: set[str] = set()
        stack = [c.key for n in names for c in self.params[n].when]
        while stack:
            key = stack.pop()
            if key not in found:
                found.add(key)
                stack.extend(c.key for c in self.params[key].when)
        return [n for n in self.order if n in found]

    def _joint_activation(self, a: str, b: str) -> dict[str, Any] | None:
        """An assignment of the parents under which both `a` and `b` are active, or None if there is none."""
        keys = self._ancestors([a, b])
        for values in itertools.product(*(self.params[k].choices for k in keys)):
            config = dict(zip(keys, values, strict=True))
            if self.is_active(a, config) and self.is_active(b, config):
                return {k: v for k, v in config.items() if self.is_active(k, config)}
        return None

    def _check_exclusive_variants(self) -> None:
        by_key: dict[str, list[str]] = {}
        for name in self.params:
            by_key.setdefault(trainer_key(name), []).append(name)
        for key, names in by_key.items():
            for a, b in itertools.combinations(names, 2):
                both = self._joint_activation(a, b)
                if both is not None:
                    example = ", ".join(f"{k}={v}" for k, v in both.items()) or "always"
                    raise SearchSpaceError(
                        b,
                        f"sets the same trainer key {key} as {a}, and both are active together ({example}); "
                        "give them `when` conditions that exclude each other",
                    )
