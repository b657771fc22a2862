"""Requests and responses of the HTTP handlers, and the one route table.

A handler is ``handler(req: Request) -> Response | Awaitable[Response]``;
each area's module lists its routes as ``ROUTES = [(method, pattern,
handler)]``, a pattern's ``{name}`` segments becoming ``req.params``.
The check endpoints are not here: they run in fastlimit._http.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

# The handler modules, in the order their routes are tried.
# The modules whose ROUTES the front serves: its own, and the features' (a
# feature's routes live in its folder, beside its commands).
ROUTE_MODULES = ["fastlimit.server.http.health", "fastlimit.server.http.status",
                 "fastlimit.server.http.metrics", "fastlimit.rules.http_api",
                 "fastlimit.rls.http_json"]

PROBLEM_TYPE = "urn:fastlimit:problem:"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    params: dict[str, str]
    server: Any


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


def json_response(obj, status: int = 200, headers=()) -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":"),
                                       ensure_ascii=False).encode("utf-8"),
                    headers=list(headers))


def problem(status: int, title: str, detail: str, *, code: str | None = None,
            field: str | None = None, headers=()) -> Response:
    """An RFC 9457 problem document: the title's words make its type, the
    RESP error code and the offending field are extension members."""
    doc: dict[str, Any] = {"type": PROBLEM_TYPE + "-".join(title.lower().split()),
                           "title": title, "status": status, "detail": detail}
    if code is not None:
        doc["code"] = code
    if field is not None:
        doc["field"] = field
    response = json_response(doc, status, headers)
    response.content_type = "application/problem+json"
    return response


_PARAM = re.compile(r"\{(\w+)\}")


def _compile(pattern: str) -> re.Pattern:
    parts = _PARAM.split(pattern)
    # even indexes are literal text, odd ones parameter names
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)"
                    for i, p in enumerate(parts))
    return re.compile(regex + r"\Z")


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str        # "/v1/rules/{id}"
    regex: re.Pattern
    handler: Any

    @property
    def name(self) -> str:
        """The route's name in statistics: "GET /v1/rules/{id}"."""
        return f"{self.method} {self.pattern}"


class RouteTable:
    def __init__(self, modules=None):
        self.routes: list[Route] = []
        for name in modules or ROUTE_MODULES:
            module = import_module(name)
            for method, pattern, handler in module.ROUTES:
                self.routes.append(Route(method, pattern, _compile(pattern), handler))

    def find(self, method: str, path: str):
        """(route, params), or (None, the methods the path has)."""
        allowed = []
        for route in self.routes:
            m = route.regex.match(path)
            if m is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, {k: unquote(v) for k, v in m.groupdict().items()}
            allowed.append(route.method)
        return None, allowed


def unquote(text: str) -> str:
    """Percent-decoding to UTF-8; bytes that are not UTF-8 become U+FFFD,
    which no rule id may hold."""
    return unquote_to_bytes(text).decode("utf-8", "replace")


# The values a yes/no query parameter takes (?enforce=1); any other is 400.
FLAG_VALUES = {"1": True, "true": True, "0": False, "false": False}


def query_flag(query: dict[str, str], name: str) -> bool:
    """A yes/no parameter of a parsed query (absent: no), exactly one of
    FLAG_VALUES; ValueError for anything else, so a typo is an error and
    not a silent "no" (nor, as a substring test was, a silent "yes")."""
    value = query.get(name)
    if value is None:
        return False
    if value not in FLAG_VALUES:
        raise ValueError(f"{name} must be one of {', '.join(FLAG_VALUES)}")
    return FLAG_VALUES[value]


def parse_query(query: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        out.setdefault(name, value)
    return out
