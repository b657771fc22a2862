"""Pure ASGI rate-limit middleware: Starlette, FastAPI, or any ASGI app.

    app.add_middleware(RateLimitMiddleware, limiter=AsyncClient(...),
                       limit=Limit.per_minute(100))

A denied request gets a 429 from the middleware itself, so the application
never sees it; an allowed one goes through and its response gains the quota
headers. Only HTTP is limited; websocket and lifespan traffic pass untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastlimit.middleware.headers import Headers, denied_response, quota_headers
from fastlimit.middleware.policy import RateLimitPolicy
from fastlimit.middleware.request import AsgiRequest
from fastlimit.middleware.routes import asgi_route_resolver

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Arguments after ``app`` are those of ``RateLimitPolicy``. Use an
    ``AsyncClient`` (or the embedded ``Limiter``, which never blocks on I/O):
    a sync ``Client`` would block the event loop on every request."""

    def __init__(self, app: ASGIApp, limiter: Any, limit: Any, **policy: Any):
        self.app = app
        self.policy = RateLimitPolicy(limiter, limit, **policy)
        self._resolve_route = asgi_route_resolver(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pending = self.policy.start(AsgiRequest(scope, self._resolve_route))
        if pending is None:
            await self.app(scope, receive, send)
            return
        decision = pending.result
        if inspect.isawaitable(decision):
            decision = await decision
        if not decision.allowed:
            await send_denied(send, decision, pending.window_seconds)
            return
        extra = encode_headers(quota_headers(decision, pending.window_seconds))
        await self.app(scope, receive, with_headers(send, extra) if extra else send)


async def send_denied(send: Send, decision: Any, window_seconds: int | None) -> None:
    headers, body = denied_response(decision, window_seconds)
    await send({"type": "http.response.start", "status": 429,
                "headers": encode_headers(headers)})
    await send({"type": "http.response.body", "body": body})


def with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """A ``send`` that appends ``extra`` to the response's headers."""

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            # A new dict: the app may reuse its message or headers list.
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_with_headers


def encode_headers(headers: Headers) -> list[tuple[bytes, bytes]]:
    """ASGI wants header names lower-cased, names and values as bytes."""
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
