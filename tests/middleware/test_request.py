"""Key functions and trusted-proxy handling of X-Forwarded-For, on plain
ASGI scopes and WSGI environs."""

import hashlib

import pytest

from fastlimit.middleware import (
    client_ip,
    first_of,
    header_key,
    method_and_route,
    resolve_client_ip,
    user_key,
)
from fastlimit.middleware.request import AsgiRequest, WsgiRequest, parse_networks

TRUSTED = parse_networks(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])


@pytest.mark.parametrize("peer, xff, expected", [
    # no trusted proxy in front: the peer, whatever the header says
    ("203.0.113.5", None, "203.0.113.5"),
    ("203.0.113.5", "198.51.100.1", "203.0.113.5"),
    # a trusted peer with no header is the client (a local health check)
    ("127.0.0.1", None, "127.0.0.1"),
    # one trusted proxy: the address it appended
    ("127.0.0.1", "198.51.100.1", "198.51.100.1"),
    # the client forged a left-most entry; the right-most untrusted one wins
    ("127.0.0.1", "1.2.3.4, 198.51.100.1", "198.51.100.1"),
    # a chain of trusted proxies is skipped from the right
    ("10.0.0.2", "1.2.3.4, 198.51.100.1, 10.0.0.7, 10.1.2.3", "198.51.100.1"),
    # every hop trusted: the left-most originated the request
    ("127.0.0.1", "10.0.0.9, 10.0.0.7", "10.0.0.9"),
    # empty entries and spaces are ignored
    ("127.0.0.1", " , 198.51.100.1 ,", "198.51.100.1"),
    # ports and brackets as some proxies write them
    ("127.0.0.1", "198.51.100.1:4711", "198.51.100.1"),
    ("127.0.0.1", "[2001:DB8::1]:4711", "2001:db8::1"),
    # one spelling per address
    ("127.0.0.1", "2001:0db8:0:0::1", "2001:db8::1"),
    ("fd00::1", "2001:db8::2", "2001:db8::2"),
    ("::ffff:10.0.0.1", "198.51.100.1", "198.51.100.1"),   # v4-mapped trusted peer
    ("::ffff:203.0.113.5", None, "203.0.113.5"),
    # garbage written by a trusted proxy is still that proxy's word
    ("127.0.0.1", "unknown", "unknown"),
    (None, "198.51.100.1", None),                            # no peer address at all
])
def test_resolve_client_ip(peer, xff, expected):
    assert resolve_client_ip(peer, xff, TRUSTED) == expected


def asgi_scope(path="/items/7", method="GET", headers=(), client=("127.0.0.1", 5000), **extra):
    return {"type": "http", "method": method, "path": path, "client": client,
            "headers": [(k.encode(), v.encode()) for k, v in headers], **extra}


def wsgi_environ(path="/items/7", method="GET", headers=(), remote="127.0.0.1", **extra):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "",
               "REMOTE_ADDR": remote, **extra}
    for name, value in headers:
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def both(**kw):
    """The same request as ASGI and as WSGI."""
    asgi_kw = {k: v for k, v in kw.items() if k != "remote"}
    if "remote" in kw:
        asgi_kw["client"] = (kw["remote"], 5000)
    wsgi_kw = {k: v for k, v in kw.items() if k != "client"}
    return [AsgiRequest(asgi_scope(**asgi_kw)), WsgiRequest(wsgi_environ(**wsgi_kw))]


def test_repeated_forwarded_headers_are_one_list():
    request = AsgiRequest(asgi_scope(headers=[("X-Forwarded-For", "1.2.3.4"),
                                              ("x-forwarded-for", "198.51.100.1")]))
    assert request.header("x-forwarded-for") == "1.2.3.4, 198.51.100.1"
    assert client_ip(["127.0.0.1"])(request) == "ip:198.51.100.1"


@pytest.mark.parametrize("request_", both(headers=[("X-Forwarded-For", "198.51.100.1")]))
def test_client_ip_trusts_only_configured_proxies(request_):
    assert client_ip()(request_) == "ip:127.0.0.1"
    assert client_ip(["127.0.0.0/8"])(request_) == "ip:198.51.100.1"


@pytest.mark.parametrize("request_", both(headers=[("X-Api-Key", "s3cret")]))
def test_header_key_is_hashed_by_default(request_):
    digest = hashlib.blake2b(b"s3cret", digest_size=16).hexdigest()
    assert header_key("X-Api-Key")(request_) == f"x-api-key:{digest}"
    assert header_key("x-api-key", prefix="key:", hashed=False)(request_) == "key:s3cret"
    assert header_key("x-other")(request_) is None


@pytest.mark.parametrize("request_", both())
def test_first_of_falls_back(request_):
    key = first_of(header_key("x-api-key"), user_key, client_ip())
    assert key(request_) == "ip:127.0.0.1"


def test_user_key_asgi_and_wsgi():
    class User:
        is_authenticated = True
        identity = "alice"

    class Anonymous:
        is_authenticated = False

    assert user_key(AsgiRequest(asgi_scope(user=User()))) == "user:alice"
    assert user_key(AsgiRequest(asgi_scope(user=Anonymous()))) is None
    assert user_key(AsgiRequest(asgi_scope())) is None
    assert user_key(WsgiRequest(wsgi_environ(REMOTE_USER="bob"))) == "user:bob"
    assert user_key(WsgiRequest(wsgi_environ())) is None


def test_resource_uses_route_template_when_known():
    resolved = AsgiRequest(asgi_scope(method="POST"), resolve_route=lambda scope: "/items/{id}")
    assert method_and_route(resolved) == "POST /items/{id}"
    assert method_and_route(AsgiRequest(asgi_scope())) == "GET /items/7"
    assert method_and_route(WsgiRequest(wsgi_environ(SCRIPT_NAME="/api"))) == "GET /api/items/7"


def test_route_is_resolved_once_and_only_when_asked():
    calls = []
    request = AsgiRequest(asgi_scope(), resolve_route=lambda scope: calls.append(1) or None)
    assert calls == []
    assert request.route is None and request.route is None
    assert calls == [1]


def test_wsgi_content_headers_have_no_http_prefix():
    request = WsgiRequest(wsgi_environ(CONTENT_TYPE="application/json"))
    assert request.header("Content-Type") == "application/json"
