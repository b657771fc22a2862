"""WSGI rate-limit middleware: Flask, Django, or any WSGI app.

    app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, limiter=Client(...),
                                           limit=Limit.per_minute(100))

Same behaviour as the ASGI middleware: a denied request gets a 429 from the
middleware and never reaches the application; an allowed one goes through
and its response gains the quota headers. Needs a synchronous limiter
(``fastlimit.Client`` or the embedded ``fastlimit.Limiter``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from fastlimit.middleware.headers import STATUS_429, Headers, denied_response, quota_headers
from fastlimit.middleware.policy import RateLimitPolicy
from fastlimit.middleware.request import WsgiRequest
from fastlimit.middleware.routes import wsgi_route_resolver

StartResponse = Callable[..., Callable[[bytes], Any]]
WSGIApp = Callable[[dict, StartResponse], Iterable[bytes]]


class WSGIRateLimitMiddleware:
    """Arguments after ``app`` are those of ``RateLimitPolicy``."""

    def __init__(self, app: WSGIApp, limiter: Any, limit: Any, **policy: Any):
        self.app = app
        self.policy = RateLimitPolicy(limiter, limit, **policy)
        self._resolve_route = wsgi_route_resolver(app)

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        pending = self.policy.start(WsgiRequest(environ, self._resolve_route))
        if pending is None:
            return self.app(environ, start_response)
        decision = pending.result
        if inspect.isawaitable(decision):
            _discard(decision)
            raise TypeError("WSGIRateLimitMiddleware needs a synchronous limiter "
                            "(fastlimit.Client or fastlimit.Limiter), not an AsyncClient")
        if not decision.allowed:
            headers, body = denied_response(decision, pending.window_seconds)
            start_response(STATUS_429, headers)
            return [body]
        extra = quota_headers(decision, pending.window_seconds)
        return self.app(environ, with_headers(start_response, extra) if extra else start_response)


def with_headers(start_response: StartResponse, extra: Headers) -> StartResponse:
    """A ``start_response`` that appends ``extra`` to the response's headers."""

    def start_with_headers(status: str, headers: Headers, exc_info: Any = None):
        return start_response(status, [*headers, *extra], exc_info)

    return start_with_headers


def _discard(awaitable: Any) -> None:
    """Close an un-awaited coroutine so it does not warn at garbage collection."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
