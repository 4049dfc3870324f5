"""Convert a `SearchSpace` to NNI's search-space JSON and NNI's parameters back to a flat configuration.

NNI expresses conditions by nesting: a choice whose options are dicts with `_name` carries, inside each option,
the parameters that exist only when that option is chosen. A conditional parameter is nested under the options
of its deepest parent (the categorical of its `when` that comes last in the space's order) for which that clause
holds, so `{not: none}` copies it into every other option; NNI samples one option, so at most one copy is ever
sampled. A parent's own nesting carries its conditions along (a child of `use_nvlamb`, itself under
`optimizer.name: lamb`, exists only for LAMB). Clauses on other parents that nesting cannot express are enforced
by `from_nni_params(params, space)`, which drops parameters whose condition is false and reads integers back as
`int` (NNI's qloguniform returns floats).

Integers: [low, high] (inclusive) becomes `randint` [low, high + 1] (NNI's upper bound is exclusive), or
`qloguniform` [low, high, 1] on a log scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search_spaces.errors import SearchSpaceError
from search_spaces.space import CategoricalParam, Clause, FloatParam, IntParam, Param, SearchSpace


def to_nni(space: SearchSpace) -> dict[str, Any]:
    """The NNI search-space JSON (a dict) of `space`, conditional parameters nested via `_name`."""
    return {name: _nni_spec(space, name) for name in space if not space[name].when}


def from_nni_params(params: Mapping[str, Any], space: SearchSpace | None = None) -> dict[str, Any]:
    """Flatten NNI's (nested) parameters to {parameter name: value}.

    With `space`, integers are read back as int and parameters whose condition is false are dropped.
    """
    flat = _flatten(params)
    if space is None:
        return flat
    for name in flat:
        if name not in space:
            raise SearchSpaceError(name, "NNI returned a parameter that is not in the search space")
    typed = {name: _typed(space[name], value) for name, value in flat.items()}
    return {name: typed[name] for name in space if name in typed and space.is_active(name, typed)}


def to_nni_params(params: Mapping[str, Any], space: SearchSpace) -> dict[str, Any]:
    """A flat configuration in NNI's (nested) form, as `to_nni(space)`'s tuners generate it: the inverse of
    `from_nni_params` (a conditional parameter sits, with its value, in the `_name` option of its nesting parent)."""
    return {name: _nni_value(space, name, params) for name in space if not space[name].when and name in params}


def _nni_value(space: SearchSpace, name: str, params: Mapping[str, Any]) -> Any:
    children = _children(space, name) if isinstance(space[name], CategoricalParam) else []
    if not children:
        return params[name]
    option: dict[str, Any] = {"_name": params[name]}
    for child in children:
        if child in params and _nesting_clause(space, child).holds(params[name]):
            option[child] = _nni_value(space, child, params)
    return option


def _nesting_clause(space: SearchSpace, name: str) -> Clause:
    """The clause a conditional parameter is nested by: the one on its deepest parent (latest in the order)."""
    return max(space[name].when, key=lambda c: space.order.index(c.key))


def _children(space: SearchSpace, parent: str) -> list[str]:
    """Conditional parameters nested under `parent`'s options."""
    return [name for name in space if space[name].when and _nesting_clause(space, name).key == parent]


def _nni_spec(space: SearchSpace, name: str) -> dict[str, Any]:
    param = space[name]
    if isinstance(param, CategoricalParam):
        children = _children(space, name)
        if not children:
            return {"_type": "choice", "_value": list(param.choices)}
        options = [_option(space, value, children) for value in param.choices]
        return {"_type": "choice", "_value": options}
    return _numeric_spec(param)


def _option(space: SearchSpace, value: Any, children: list[str]) -> dict[str, Any]:
    option: dict[str, Any] = {"_name": value}
    for child in children:
        if _nesting_clause(space, child).holds(value):
            option[child] = _nni_spec(space, child)
    return option


def _numeric_spec(param: Param) -> dict[str, Any]:
    if isinstance(param, FloatParam):
        return {"_type": "loguniform" if param.log else "uniform", "_value": [param.low, param.high]}
    if param.log:
        return {"_type": "qloguniform", "_value": [param.low, param.high, 1]}
    return {"_type": "randint", "_value": [param.low, param.high + 1]}


def _flatten(params: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Mapping) and "_name" in value:
            flat[name] = value["_name"]
            flat.update(_flatten({k: v for k, v in value.items() if k != "_name"}))
        else:
            flat[name] = value
    return flat


def _typed(param: Param, value: Any) -> Any:
    if isinstance(param, IntParam) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
