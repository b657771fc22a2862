"""The ASGI middleware in front of a real Starlette app under uvicorn, with a
real fastlimit server (manual clock) behind an AsyncClient, over HTTP."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from httpkit import denied, quota, request
from fastlimit.client import AsyncClient
from fastlimit.embedded import Limiter
from fastlimit.middleware import (Limit, RateLimitMiddleware, Rules, client_ip, first_of,
                                  header_key)

TEXT = [("content-length", "5"), ("content-type", "text/plain; charset=utf-8")]


def starlette_app(limiter, limit, **policy):
    """A small app whose endpoints count their calls."""
    calls = Counter()

    def endpoint(name):
        async def handle(req):
            calls[name] += 1
            return PlainTextResponse(name[:5].ljust(5, "."))
        return handle

    app = Starlette(routes=[
        Route("/hello", endpoint("hello")),
        Route("/users/{user_id:int}", endpoint("users")),
        Route("/export", endpoint("export"), methods=["POST"]),
        Route("/login", endpoint("login"), methods=["POST"]),
    ])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=limit, **policy)
    return app, calls


@pytest.fixture
def client(server):
    """An AsyncClient on the shared manual-clock server; a generous timeout,
    since these tests are about HTTP, not about a loaded machine's latency."""
    return AsyncClient(servers=f"127.0.0.1:{server.port}", timeout_ms=2000)


def bucket(r, key, capacity=3, refill=1):
    """A bucket's state on the server, read without spending (COST 0)."""
    return r.execute_command("CL.CHECK", key, capacity, refill, "COST", 0)


def test_allowed_then_denied_exact_headers_and_body(r, client, serve_asgi):
    app, calls = starlette_app(client, Limit(3, 1))
    port = serve_asgi(app)

    for remaining, reset in [(2, 1), (1, 2), (0, 3)]:
        resp = request(port, "/hello")
        assert (resp.status, resp.body) == (200, b"hello")
        assert resp.headers == TEXT + quota(3, remaining, reset, 3)

    for _ in range(5):
        resp = request(port, "/hello")
        assert resp.status == 429
        assert (resp.headers, resp.body) == denied(1, 3, 0, 3, 3)
        assert resp.body == b'{"error": "rate_limited", "retry_after_seconds": 1}'
    assert calls == {"hello": 3}  # the app never saw the denied requests

    r.execute_command("DEBUG", "CLOCK", "SET", 1500)  # 1.5 tokens back
    resp = request(port, "/hello")
    assert resp.status == 200
    assert resp.headers == TEXT + quota(3, 0, 3, 3)   # 0.5 left, full in 2.5 s
    resp = request(port, "/hello")
    assert (resp.status, resp.headers) == (429, denied(1, 3, 0, 3, 3)[0])
    assert calls == {"hello": 4}


def test_route_template_is_the_resource(r, client, serve_asgi):
    app, calls = starlette_app(client, Limit(3, 1))
    port = serve_asgi(app)
    assert [request(port, f"/users/{i}").status for i in range(1, 6)] == [200, 200, 200, 429, 429]
    assert calls == {"users": 3}
    # one bucket for the route, per client; other routes have their own
    assert bucket(r, "GET /users/{user_id:int}|ip:127.0.0.1") == [1, 3, 0, 0, 3000]
    assert request(port, "/hello").status == 200
    assert calls == {"users": 3, "hello": 1}


def test_x_forwarded_for_only_from_trusted_proxies(r, server, client, serve_asgi):
    # each app runs on its own event loop, so each gets its own AsyncClient
    other_client = AsyncClient(servers=f"127.0.0.1:{server.port}", timeout_ms=2000)
    trusting = starlette_app(client, Limit(3, 1), key=client_ip(["127.0.0.1"]))[0]
    wary = starlette_app(other_client, Limit(3, 1), key=client_ip())[0]
    trusting_port, wary_port = serve_asgi(trusting), serve_asgi(wary)

    def hello(port, xff):
        return request(port, "/hello", headers={"X-Forwarded-For": xff}).status

    # behind a trusted proxy each client has its own bucket, and forging a
    # left-most entry does not buy a new one
    assert [hello(trusting_port, "198.51.100.1") for _ in range(3)] == [200] * 3
    assert hello(trusting_port, "6.6.6.6, 198.51.100.1") == 429
    assert hello(trusting_port, "198.51.100.2") == 200
    assert bucket(r, "GET /hello|ip:198.51.100.2")[2] == 2
    # from an untrusted peer the header is ignored: everyone is 127.0.0.1
    assert [hello(wary_port, f"198.51.100.{i}") for i in range(4)] == [200, 200, 200, 429]
    assert bucket(r, "GET /hello|ip:127.0.0.1")[2] == 0


def test_api_key_tiers_and_cost(r, client, serve_asgi):
    app, calls = starlette_app(
        client, {None: Limit(2, 1), "paid": Limit(10, 1)},
        key=first_of(header_key("x-api-key", prefix="key:", hashed=False), client_ip()),
        tier=lambda req: "paid" if req.header("x-api-key") == "acme" else None,
        cost=lambda req: 4 if req.path == "/export" else 1)
    port = serve_asgi(app)

    def export(api_key=None):
        return request(port, "/export", method="POST",
                       headers={"X-Api-Key": api_key} if api_key else {})

    resp = export("acme")
    assert resp.status == 200
    assert resp.headers == TEXT + quota(10, 6, 4, 10)
    assert [export("acme").status for _ in range(2)] == [200, 429]   # 6 -> 2, then 2 < 4
    resp = export("acme")
    assert (resp.headers, resp.body) == denied(2, 10, 2, 8, 10)
    # a free key: capacity 2, so an export (cost 4) can never pass
    resp = export("free-key")
    assert (resp.status, resp.headers, resp.body) == (429, *denied(None, 2, 2, 0, 2))
    # no key at all: limited by IP, with the default tier
    assert request(port, "/hello").headers == TEXT + quota(2, 1, 1, 2)
    assert calls == {"export": 2, "hello": 1}
    assert bucket(r, "POST /export|key:acme", 10, 1)[2] == 2


def test_requests_without_a_key_pass_unlimited(client, serve_asgi):
    app, calls = starlette_app(client, Limit(1, 1), key=header_key("x-api-key"))
    port = serve_asgi(app)
    for _ in range(5):
        resp = request(port, "/hello")
        assert (resp.status, resp.headers) == (200, TEXT)
    assert calls == {"hello": 5}
    assert request(port, "/hello", headers={"X-Api-Key": "k"}).status == 200
    assert request(port, "/hello", headers={"X-Api-Key": "k"}).status == 429


def test_embedded_limiter(serve_asgi):
    app, calls = starlette_app(Limiter(), Limit(2, 1))
    port = serve_asgi(app)
    statuses = [request(port, "/hello").status for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    assert calls == {"hello": 2}


def test_outage_fails_open_or_closed_per_route(make_server, serve_asgi):
    server = make_server("--manual-clock")
    # seconds: the outage is a stopped server, refused at once, and a late reply
    # of the traced server must not fail open before it
    client = AsyncClient(servers=f"127.0.0.1:{server.port}", timeout_ms=2000)
    app, calls = starlette_app(
        client, Limit(3, 1),
        on_failure=lambda req: "closed" if req.path == "/login" else "open")
    port = serve_asgi(app)
    assert request(port, "/hello").headers == TEXT + quota(3, 2, 1, 3)
    assert request(port, "/login", method="POST").status == 200

    server.stop()
    # product route: allowed, with no quota claimed since none is known
    resp = request(port, "/hello")
    assert (resp.status, resp.headers, resp.body) == (200, TEXT, b"hello")
    # security route: denied, told to come back in a second, app untouched
    resp = request(port, "/login", method="POST")
    assert resp.status == 429
    assert resp.headers == [("content-type", "application/json"), ("content-length", "51"),
                            ("retry-after", "1")]
    assert resp.json() == {"error": "rate_limited", "retry_after_seconds": 1}
    assert calls == {"hello": 2, "login": 1}


def test_server_rules(make_server, serve_asgi):
    """Rules(): the server's rules decide (CL.LIMIT), matched on the resource."""
    server = make_server("--manual-clock")
    rule = json.dumps({"match": {"resource": "GET /hello"}, "capacity": 2, "refill_per_second": 1})
    server.client().execute_command("CL.RULE", "SET", "hello", rule)
    client = AsyncClient(servers=f"127.0.0.1:{server.port}", timeout_ms=2000)
    app, calls = starlette_app(client, Rules(window_seconds=2))
    port = serve_asgi(app)
    assert request(port, "/hello").headers == TEXT + quota(2, 1, 1, 2)
    assert request(port, "/hello").headers == TEXT + quota(2, 0, 2, 2)
    resp = request(port, "/hello")
    assert (resp.status, resp.headers, resp.body) == (429, *denied(1, 2, 0, 2, 2))
    assert calls == {"hello": 2}


def test_websocket_and_lifespan_pass_through():
    """Only HTTP is limited; other scope types reach the app untouched."""
    import asyncio

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    class NeverAsked:
        def check(self, *a, **kw):
            raise AssertionError("limiter called for a non-HTTP scope")

    middleware = RateLimitMiddleware(app, NeverAsked(), Limit(1, 1))
    for kind in ("websocket", "lifespan"):
        asyncio.run(middleware({"type": kind}, None, None))
    assert seen == ["websocket", "lifespan"]
