"""The WSGI middleware in front of a real Flask app under werkzeug's threaded
server, with a real fastlimit server (manual clock) behind a sync Client,
over HTTP."""

from __future__ import annotations

from collections import Counter

import pytest
from flask import Flask

from fastlimit.client import AsyncClient, Client
from fastlimit.embedded import Limiter
from fastlimit.middleware import Limit, WSGIRateLimitMiddleware, client_ip, first_of, header_key
from httpkit import denied, quota, request

TEXT = [("content-type", "text/html; charset=utf-8"), ("content-length", "5")]


def flask_app(limiter, limit, **policy):
    """A small app whose views count their calls."""
    app = Flask(__name__)
    calls = Counter()

    @app.get("/hello")
    def hello():
        calls["hello"] += 1
        return "hello"

    @app.get("/users/<int:user_id>")
    def users(user_id):
        calls["users"] += 1
        return "users"

    @app.post("/login")
    def login():
        calls["login"] += 1
        return "login"

    @app.post("/export")
    def export():
        calls["export"] += 1
        return "expor"

    app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, limiter, limit, **policy)
    return app, calls


@pytest.fixture
def client(server):
    with Client(servers=f"127.0.0.1:{server.port}", timeout_ms=2000) as c:
        yield c


def bucket(r, key, capacity=3, refill=1):
    return r.execute_command("CL.CHECK", key, capacity, refill, "COST", 0)


def test_allowed_then_denied_exact_headers_and_body(r, client, serve_wsgi):
    app, calls = flask_app(client, Limit(3, 1))
    port = serve_wsgi(app)

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

    r.execute_command("DEBUG", "CLOCK", "SET", 2500)  # 2.5 tokens back
    assert [request(port, "/hello").status for _ in range(3)] == [200, 200, 429]
    assert calls == {"hello": 5}


def test_flask_rule_is_the_resource(r, client, serve_wsgi):
    app, calls = flask_app(client, Limit(3, 1))
    port = serve_wsgi(app)
    assert [request(port, f"/users/{i}").status for i in range(1, 6)] == [200, 200, 200, 429, 429]
    assert calls == {"users": 3}
    assert bucket(r, "GET /users/<int:user_id>|ip:127.0.0.1") == [1, 3, 0, 0, 3000]
    # an unknown path is limited by its path (and still gets the app's 404)
    assert request(port, "/nope").status == 404
    assert bucket(r, "GET /nope|ip:127.0.0.1")[2] == 2


def test_x_forwarded_for_and_api_keys(r, client, serve_wsgi):
    app, calls = flask_app(
        client, Limit(3, 1),
        key=first_of(header_key("x-api-key", prefix="key:", hashed=False),
                     client_ip(trusted_proxies=["127.0.0.0/8"])))
    port = serve_wsgi(app)

    def hello(**headers):
        return request(port, "/hello", headers=headers).status

    assert [hello(**{"X-Forwarded-For": "198.51.100.1"}) for _ in range(3)] == [200] * 3
    assert hello(**{"X-Forwarded-For": "6.6.6.6, 198.51.100.1"}) == 429
    assert hello(**{"X-Forwarded-For": "198.51.100.2"}) == 200
    # an API key wins over the address
    assert [hello(**{"X-Api-Key": "acme", "X-Forwarded-For": "198.51.100.1"})
            for _ in range(4)] == [200, 200, 200, 429]
    assert bucket(r, "GET /hello|key:acme")[2] == 0
    assert calls == {"hello": 7}


def test_cost_above_capacity_is_denied_without_retry_after(client, serve_wsgi):
    app, calls = flask_app(client, Limit(3, 1), cost=lambda req: 5)
    port = serve_wsgi(app)
    resp = request(port, "/export", method="POST")
    assert (resp.status, resp.headers, resp.body) == (429, *denied(None, 3, 3, 0, 3))
    assert calls == {}


def test_embedded_limiter(serve_wsgi):
    app, calls = flask_app(Limiter(), Limit.per_minute(2))
    port = serve_wsgi(app)
    resp = request(port, "/hello")
    assert resp.headers == TEXT + quota(2, 1, 30, 60)
    assert [request(port, "/hello").status for _ in range(3)] == [200, 429, 429]
    assert calls == {"hello": 2}


def test_outage_fails_open_or_closed_per_route(make_server, serve_wsgi):
    server = make_server("--manual-clock")
    # seconds: the outage is a stopped server, refused at once, and a late reply
    # of the traced server must not fail open before it
    with Client(servers=f"127.0.0.1:{server.port}", timeout_ms=2000) as client:
        app, calls = flask_app(
            client, Limit(3, 1),
            on_failure=lambda req: "closed" if req.path == "/login" else "open")
        port = serve_wsgi(app)
        assert request(port, "/hello").headers == TEXT + quota(3, 2, 1, 3)

        server.stop()
        resp = request(port, "/hello")
        assert (resp.status, resp.headers, resp.body) == (200, TEXT, b"hello")
        resp = request(port, "/login", method="POST")
        assert resp.status == 429
        assert resp.headers == [("content-type", "application/json"),
                                ("content-length", "51"), ("retry-after", "1")]
        assert resp.json() == {"error": "rate_limited", "retry_after_seconds": 1}
        assert calls == {"hello": 2}
        assert client.stats.failed_open == 1 and client.stats.failed_closed == 1


def test_async_client_is_refused_under_wsgi(server):
    app = WSGIRateLimitMiddleware(lambda environ, start: [b""],
                                  AsyncClient(servers=f"127.0.0.1:{server.port}"), Limit(1, 1))
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "127.0.0.1"}
    with pytest.raises(TypeError, match="synchronous limiter"):
        app(environ, lambda status, headers, exc_info=None: None)
