"""Convert a `SearchSpace` to a ConfigSpace `ConfigurationSpace` (for SMAC3) and configurations back.

Hyperparameter names are the space's parameter names (`optimizer.lr@lamb` included), so the conversion is
one-to-one. This is the only module of the project that imports ConfigSpace, and only when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from search_spaces.errors import SearchSpaceError
from search_spaces.space import CategoricalParam, Clause, IntParam, SearchSpace

if TYPE_CHECKING:
    import ConfigSpace


def to_configspace(space: SearchSpace, seed: int | None = None) -> ConfigSpace.ConfigurationSpace:
    """The equivalent ConfigSpace: Float/Integer (log scale kept), Categorical, and conditions."""
    import ConfigSpace as CS

    cs = CS.ConfigurationSpace(seed=seed)
    hps = {name: _hyperparameter(name, space[name]) for name in space}
    cs.add(*hps.values())
    conditions = [_condition(hps, name, space[name].when) for name in space if space[name].when]
    if conditions:
        cs.add(*conditions)
    return cs


def from_configuration(config: Mapping[str, Any]) -> dict[str, Any]:
    """The active values of a ConfigSpace `Configuration` (or any mapping), as plain Python values."""
    return {str(name): _python(value) for name, value in dict(config).items() if value is not None}


def _hyperparameter(name: str, param: Any) -> Any:
    import ConfigSpace as CS

    if isinstance(param, CategoricalParam):
        return CS.Categorical(name, list(param.choices))
    if isinstance(param, IntParam):
        return CS.Integer(name, (param.low, param.high), log=param.log)
    # ConfigSpace rounds a float's bounds to 13 decimal places: refuse a range that this changes (a bound below
    # 5e-14 becomes 0) rather than let SMAC3 sample outside it, or fail when the tuner starts.
    try:
        hp = CS.Float(name, (param.low, param.high), log=param.log)
    except ValueError:
        hp = None
    bounds = (param.low, param.high)
    scale = (abs(param.low), abs(param.high)) if param.log else (param.high - param.low,) * 2
    if hp is None or any(abs(a - b) > 1e-9 * s for a, b, s in zip((hp.lower, hp.upper), bounds, scale, strict=True)):
        raise SearchSpaceError(name, f"SMAC3's ConfigSpace keeps 13 decimal places of a bound, so it cannot tune "
                                     f"[{param.low:g}, {param.high:g}]; narrow the range, or use the random tuner, "
                                     "asha with sampler random, or an NNI tuner")  # fmt: skip
    return hp


def _condition(hps: dict[str, Any], name: str, when: tuple[Clause, ...]) -> Any:
    import ConfigSpace as CS

    conditions = [_clause(hps[name], hps[c.key], c) for c in when]
    return conditions[0] if len(conditions) == 1 else CS.AndConjunction(*conditions)


def _clause(child: Any, parent: Any, clause: Clause) -> Any:
    import ConfigSpace as CS

    if clause.op == "eq":
        return CS.EqualsCondition(child, parent, clause.values[0])
    if clause.op == "in":
        return CS.InCondition(child, parent, list(clause.values))
    # {not: ...}: the complement of the parent's finite choices. Not ConfigSpace's NotEqualsCondition, which holds on
    # an inactive parent (its check takes an absent value as unequal, so it would ask for a child our space leaves
    # out), and it has no "not in".
    allowed = [v for v in parent.choices if clause.holds(_python(v))]
    return CS.InCondition(child, parent, allowed)


def _python(value: Any) -> Any:
    """numpy scalars (np.str_, np.int64, np.bool_, np.float64) -> Python builtins."""
    return value.item() if hasattr(value, "item") else value
