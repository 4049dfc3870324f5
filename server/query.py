"""Query strings held to what the route declares: a key the endpoint does not take, or a single-valued key given
more than once, is a 422 naming it. FastAPI alone ignores the first (a mistyped filter, `?stat=failed`, would list
every trial) and keeps the last value of the second (`?arm=a&arm=b` would answer for b alone)."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence

from fastapi import HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute


def _takes_many(annotation: object) -> bool:
    """Whether a query parameter of this type may repeat (a list of values), through `X | None`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_takes_many(arg) for arg in typing.get_args(annotation))
    return isinstance(origin, type) and issubclass(origin, Sequence) and not issubclass(origin, str | bytes)


def _declared(route: APIRoute) -> dict[str, bool]:
    """The query parameters `route` takes (by their names in the URL), its own and its dependencies', each with
    whether it may repeat."""
    declared: dict[str, bool] = {}

    def walk(dependant: Dependant) -> None:
        for param in dependant.query_params:
            declared[param.alias] = _takes_many(param.field_info.annotation)
        for sub in dependant.dependencies:
            walk(sub)

    walk(route.dependant)
    return declared


_KEPT: dict[int, tuple[APIRoute, dict[str, bool]]] = {}  # each route's declared keys, by the route's id


def _issue(key: str, msg: str, kind: str) -> dict:
    return {"loc": ["query", key], "msg": msg, "type": kind}


async def strict_query(request: Request) -> None:
    """Refuse (422, in FastAPI's shape: one entry per key) a query key the route does not declare, naming the keys
    it takes, and a single-valued key given more than once. A router dependency: it runs before the route's own."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    kept = _KEPT.get(id(route))
    if kept is None or kept[0] is not route:  # read once per route: the hot reads pay a dict lookup
        kept = _KEPT[id(route)] = (route, _declared(route))
    declared = kept[1]
    issues = []
    for key in dict.fromkeys(request.query_params.keys()):
        if key not in declared:
            takes = ", ".join(declared) if declared else "no query parameters"
            issues.append(_issue(key, f"unknown query parameter {key!r}: this endpoint takes {takes}", "unknown"))
        elif not declared[key] and len(values := request.query_params.getlist(key)) > 1:
            given = "&".join(f"{key}={value}" for value in values)
            msg = f"{key} is given {len(values)} times ({given}): it takes one value; ask each with a request of its "
            msg += "own"
            issues.append(_issue(key, msg, "repeated"))
    if issues:
        raise HTTPException(422, issues)
