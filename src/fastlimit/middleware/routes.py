"""Find the route template of a request before the application sees it.

A middleware runs before the framework's router, so it cannot read the
matched route from the request; instead it asks the router itself. Both
lookups are duck-typed (no framework import): Starlette/FastAPI routers
have ``routes`` whose items have ``matches(scope)``; Flask has a werkzeug
``url_map``. Anything else gets None and the resource falls back to the path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_WRAPPER_DEPTH = 16  # how many wrapping middlewares to look through


def find_attribute(app: Any, name: str) -> Any:
    """The first object down a chain of wrappers (``.app``, a bound method's
    ``__self__``) that has attribute ``name``, or None."""
    obj = app
    for _ in range(MAX_WRAPPER_DEPTH):
        if obj is None:
            return None
        if hasattr(obj, name):
            return obj
        obj = getattr(obj, "__self__", None) or getattr(obj, "app", None)
    return None


def asgi_route_resolver(app: Any) -> Callable[[dict], str | None] | None:
    """For a Starlette/FastAPI app (or its middleware stack): scope -> template."""
    router = find_attribute(app, "routes")
    if router is None:
        return None

    def resolve(scope: dict) -> str | None:
        try:
            return _match_starlette(router.routes, scope, "")
        except Exception:  # a router we do not understand: fall back to the path
            return None

    return resolve


def _match_starlette(routes: Any, scope: dict, prefix: str) -> str | None:
    """Starlette's own matching order: the first full match wins, else the
    first partial one (right path, wrong method: the app will answer 405)."""
    partial = None
    for route in routes:
        match, child_scope = route.matches(scope)
        if match.name == "NONE":
            continue
        template = prefix + getattr(route, "path", "")
        nested = getattr(route, "routes", None)
        if nested:  # a Mount: descend with the scope the mount would pass on
            template = _match_starlette(nested, {**scope, **child_scope}, template) or template
        if match.name == "FULL":
            return template
        partial = partial or template
    return partial


def wsgi_route_resolver(app: Any) -> Callable[[dict], str | None] | None:
    """For a Flask app or its ``wsgi_app``: environ -> rule (``/users/<int:id>``)."""
    owner = find_attribute(app, "url_map")
    if owner is None:
        return None

    def resolve(environ: dict) -> str | None:
        try:
            rule, _ = owner.url_map.bind_to_environ(environ).match(return_rule=True)
        except Exception:  # NotFound, MethodNotAllowed, redirects: use the path
            return None
        return rule.rule

    return resolve
