"""A framework-neutral view of an incoming request, and the functions that
pick a rate-limit key, resource, tier or cost from it.

The ASGI and WSGI middleware wrap their ``scope``/``environ`` in a
``Request`` so one set of key functions serves both. Every key function
takes a ``Request`` and returns a string, or None for "do not limit this
request" (health checks, or a request that carries no key at all).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any, Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
RouteResolver = Callable[[Any], str | None]


class Request:
    """What the key, resource, tier and cost functions may look at.

    ``raw`` is the ASGI scope or the WSGI environ, for anything else.
    ``route`` is the matched route template (``/users/{id}``) when the
    framework's router can be asked, else None; it is computed on first use
    because matching costs a walk over the routes.
    """

    __slots__ = ("method", "path", "peer", "user", "raw", "_resolve_route", "_route")

    def __init__(self, method: str, path: str, peer: str | None, user: str | None,
                 raw: Any, resolve_route: RouteResolver | None = None):
        self.method = method
        self.path = path
        self.peer = peer
        self.user = user
        self.raw = raw
        self._resolve_route = resolve_route
        self._route: str | None | Literal[False] = False  # False: not resolved yet

    @property
    def route(self) -> str | None:
        """The framework's route template (``/users/{id}``), resolved on
        first use; None when the framework has none."""
        if self._route is False:
            self._route = self._resolve_route(self.raw) if self._resolve_route else None
        return self._route

    def header(self, name: str) -> str | None:
        """A request header's value (repeated headers joined by ", "), or None."""
        raise NotImplementedError


class AsgiRequest(Request):
    __slots__ = ()

    def __init__(self, scope: dict, resolve_route: RouteResolver | None = None):
        client = scope.get("client")
        super().__init__(scope["method"], scope["path"], client[0] if client else None,
                         _asgi_user(scope), scope, resolve_route)

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in self.raw.get("headers", ())
                  if k.lower() == wanted]
        return ", ".join(values) if values else None


class WsgiRequest(Request):
    __slots__ = ()

    def __init__(self, environ: dict, resolve_route: RouteResolver | None = None):
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        super().__init__(environ.get("REQUEST_METHOD", "GET"), path or "/",
                         environ.get("REMOTE_ADDR") or None,
                         environ.get("REMOTE_USER") or None, environ, resolve_route)

    def header(self, name: str) -> str | None:
        # WSGI servers already join repeated headers with commas.
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        return self.raw.get(key)


def _asgi_user(scope: dict) -> str | None:
    """The authenticated user's identity set by Starlette's AuthenticationMiddleware."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    for attr in ("identity", "display_name"):
        try:
            value = getattr(user, attr, None)
        except NotImplementedError:  # starlette's BaseUser leaves these abstract
            continue
        if value:
            return str(value)
    return None


# ---------------------------------------------------------------- key functions

KeyFunc = Callable[[Request], str | None]


def client_ip(trusted_proxies: Iterable[str] = ()) -> KeyFunc:
    """Key by client IP address: ``ip:<address>``.

    ``X-Forwarded-For`` is believed only when the connection comes from one of
    ``trusted_proxies`` (addresses or CIDR networks): anyone else could write
    any address there and get a fresh bucket on every request.
    """
    networks = parse_networks(trusted_proxies)

    def key(request: Request) -> str | None:
        ip = resolve_client_ip(request.peer, request.header("x-forwarded-for"), networks)
        return f"ip:{ip}" if ip else None

    return key


def header_key(name: str, prefix: str | None = None, hashed: bool = True) -> KeyFunc:
    """Key by a request header such as an API key: ``<prefix><value>``.

    The value is hashed by default: API keys are secrets, and bucket keys
    show up in the limiter's logs and denial samples.
    """
    prefix = f"{name.lower()}:" if prefix is None else prefix

    def key(request: Request) -> str | None:
        value = request.header(name)
        if not value:
            return None
        if hashed:
            value = hashlib.blake2b(value.encode(), digest_size=16).hexdigest()
        return prefix + value

    return key


def user_key(request: Request) -> str | None:
    """Key by the authenticated user (ASGI ``scope["user"]``, WSGI ``REMOTE_USER``)."""
    return f"user:{request.user}" if request.user else None


def first_of(*keys: KeyFunc) -> KeyFunc:
    """The first key that applies: ``first_of(header_key("x-api-key"), client_ip())``."""

    def key(request: Request) -> str | None:
        for candidate in keys:
            value = candidate(request)
            if value is not None:
                return value
        return None

    return key


def method_and_route(request: Request) -> str:
    """The default resource: ``"GET /users/{id}"``.

    The route template, not the path, so that ``/users/1`` and ``/users/2``
    share one limit and a client cannot dodge it by varying the path; the
    raw path only when no router could be asked.
    """
    return f"{request.method} {request.route or request.path}"


# ------------------------------------------------------------- trusted proxies

def parse_networks(entries: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``["10.0.0.0/8", "127.0.0.1"]`` -> networks (a bare address is a /32 or /128)."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def parse_ip(text: str) -> IPAddress | None:
    """An address as proxies write it: bare, ``v4:port`` or ``[v6]:port``; None if not one."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else text
    elif text.count(":") == 1:
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    # An IPv4 client seen through a dual-stack socket is still that IPv4 client.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


def is_trusted(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    ip = parse_ip(address)
    return ip is not None and any(ip in net for net in networks)


def resolve_client_ip(peer: str | None, forwarded_for: str | None,
                      networks: tuple[IPNetwork, ...]) -> str | None:
    """The client's address, given the TCP peer and the X-Forwarded-For header.

    Each trusted proxy appends the address it received the request from, so
    the header is read right to left, skipping trusted proxies: the first
    address that is not a trusted proxy was written by one and is the client.
    Everything to its left came from the client and may be forged. If every
    hop is trusted, the left-most one originated the request.
    """
    if peer is None:
        return None
    if not forwarded_for or not is_trusted(peer, networks):
        return _normalize(peer)
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not is_trusted(hop, networks):
            return _normalize(hop)
    return _normalize(hops[0]) if hops else _normalize(peer)


def _normalize(address: str) -> str:
    """One spelling per address (``2001:DB8::1`` == ``2001:db8:0::1``), so one bucket."""
    ip = parse_ip(address)
    return str(ip) if ip is not None else address.strip()
