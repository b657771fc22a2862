"""The HTTP front as a subsystem: it listens on http-port on every bind
address, hands each connection to fastlimit._http.HttpConnection, routes
the requests that connection does not answer itself to the handlers
(routes.py), and encodes their responses."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import cast

from fastlimit._http import (
    ERROR_STATUS,
    OPEN_PATHS,
    REASONS,
    BadField,
    HttpConnection,
    HttpShared,
    status_line,
)
from fastlimit._protocol import Command
from fastlimit.server.http.routes import (
    Request,
    Response,
    RouteTable,
    parse_query,
    problem,
    query_flag,
    unquote,
)
from fastlimit.server.subsystem import Subsystem
from fastlimit.structured_fields import sf_string

NS = 1_000_000_000


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date() -> str:
    """Now as RFC 9110's IMF-fixdate, what email.utils.formatdate(usegmt=True)
    writes, without importing the email package at every server start."""
    t = time.gmtime()
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")

class HttpFront(Subsystem):
    response_type = Response

    def __init__(self, server, log: logging.Logger):
        self.server = server
        self.log = log
        self.port = 0
        self.routes = RouteTable()
        self.shared = HttpShared(server.core, self)
        # Every route counts as an endpoint does (calls, time, failures).
        for route in self.routes.routes:
            self.shared.endpoint_stats.setdefault(route.name, Command(route.name, 0))
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def endpoint_stats(self):
        return self.shared.endpoint_stats

    def apply_settings(self, s) -> None:
        shared = self.shared
        shared.max_header_bytes = s.http_max_header_bytes
        shared.max_body_bytes = s.http_max_body_bytes
        shared.header_timeout_ns = int(s.http_header_timeout * NS)
        shared.body_timeout_ns = int(s.http_body_timeout * NS)
        shared.body_memory = s.http_body_memory
        shared.batch_max = s.http_batch_max
        shared.metrics_auth = s.http_metrics_auth

    async def start(self) -> None:
        self.shared.set_date(http_date())
        self._servers, self.port = await self.server.listen_front(
            "HTTP", lambda: cast(asyncio.BaseProtocol, HttpConnection(self.shared)),
            self.shared, self.server.tls.server if self.server.settings.tls_http else None)

    def tick(self) -> None:
        if self._servers:
            self.shared.sweep()

    def cron(self) -> None:
        if self._servers:
            self.shared.set_date(http_date())

    def info_sections(self, sections, named):
        shared = self.shared
        return {"clients": {"http_connected_clients": len(shared.connections)},
                "memory": {"mem_http_bodies": shared.body_bytes},
                "stats": {"http_port": self.port,
                          "http_total_connections_received": shared.total_connections,
                          "http_rejected_connections": shared.rejected_connections,
                          "http_total_requests": shared.total_requests,
                          "http_bad_requests": shared.bad_requests}}

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT: the per-endpoint and the front's counters."""
        shared = self.shared
        for stats in shared.endpoint_stats.values():
            stats.reset_stats()
        shared.total_requests = shared.total_connections = shared.rejected_connections = 0
        shared.bad_requests = 0

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for conn in list(self.shared.connections):
            conn.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    # ---- what fastlimit._http asks of the event-loop layer ------------------------------

    def route_refusal(self, user, method: bytes, path: bytes) -> Response | None:
        """A 403 for a restricted ACL user (see acl/users.py) asking for a
        route whose RESP equivalent it may not run (the rules API as
        CL.RULE's subcommands, metrics and status as INFO); routes without
        one are for unrestricted users only.  None: go on."""
        if user is None or user.grant is None or path in OPEN_PATHS:
            return None
        words = route_command(method.decode("latin-1"), path.decode("latin-1")) or ()
        acl = self.server.acl
        cmd = self.server.core.commands.get(words[0]) if words else None
        if cmd is not None and len(words) > 1:
            cmd = cmd.subcommands.get(words[1])
        why = acl.refusal(user, cmd, list(words)) if cmd is not None else \
            f"This user may not use {path.decode('latin-1')[:200]} (ACL users with limits " \
            f"may use the check endpoints, the rules API and metrics, by their commands)"
        if why is None:
            return None
        acl.log_denial(None, "command", cmd.name if cmd is not None else "http", False,
                       username=user.name, client_info="http")
        return problem(403, "forbidden", why, code="NOPERM")

    def route(self, method: bytes, path: bytes, query: bytes, headers: list, body: bytes):
        """The response of a handler (or an awaitable of one)."""
        method_text, raw_path = method.decode("latin-1"), path.decode("latin-1")
        route, found = self.routes.find(method_text, raw_path)
        if route is None:
            if found:
                return problem(405, "method not allowed",
                               f"{raw_path} takes {', '.join(sorted(set(found)))}",
                               headers=[("Allow", ", ".join(sorted(set(found))))])
            return problem(404, "not found", f"no endpoint {raw_path}")
        merged: dict[str, str] = {}
        for name, value in headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            merged[key] = f"{merged[key]}, {text}" if key in merged else text
        stats = self.shared.endpoint_stats[route.name]
        started = time.perf_counter_ns()
        response = route.handler(Request(method_text, unquote(raw_path), parse_query(query),
                                         merged, body, found, self.server))
        if isinstance(response, Response):
            count(stats, response, started)
            return response
        return self._counted(response, stats, started)

    async def after(self, previous, user, method: bytes, path: bytes, query: bytes,
                    headers: list, body: bytes) -> Response:
        """A request that came on a connection while an earlier one waits
        (a rule change written through a store): routed once that one is
        done, so that it sees what the earlier one changed."""
        await asyncio.wait([previous])
        response = self.route_refusal(user, method, path)
        if response is None:
            response = self.route(method, path, query, headers, body)
        if not isinstance(response, Response):
            response = await response
        return response

    async def _counted(self, awaitable, stats, started: int) -> Response:
        response = await awaitable
        count(stats, response, started)
        return response

    async def finish(self, awaitable, keep: bool, head: bool) -> bytes:
        try:
            response = await awaitable
        except Exception:
            self.log.exception("HTTP handler failed")
            response = problem(500, "internal server error", "the server failed; see its log")
        return self.encode(response, keep, head)

    def encode(self, response: Response, keep: bool, head: bool) -> bytes:
        lines = [status_line(response.status).decode("ascii").rstrip("\r\n"),
                 f"Date: {http_date()}"]
        if response.status != 204 and response.status != 304:
            lines += [f"Content-Type: {response.content_type}",
                      f"Content-Length: {len(response.body)}"]
        lines += [f"{name}: {value}" for name, value in response.headers]
        if not keep:
            lines.append("Connection: close")
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if head or response.status in (204, 304):
            return head_bytes
        return head_bytes + response.body

    def problem(self, status: int, title: str, detail: str) -> Response:
        return problem(status, title, detail)

    def unauthorized(self) -> Response:
        return problem(401, "unauthorized", "this server needs a user's password: "
                       "Authorization: Basic base64(user:password), or Bearer <password> "
                       "of the default user",
                       code="NOAUTH",
                       headers=[("WWW-Authenticate", 'Basic realm="fastlimit", '
                                                     'Bearer realm="fastlimit"')])

    def enforced(self, query: bytes) -> bool:
        """Whether a check's query asks a denial to be a 429 (?enforce=)."""
        try:
            return query_flag(parse_query(query), "enforce")
        except ValueError as e:
            raise BadField("enforce", str(e)) from None

    def bad_field(self, e) -> Response:
        title = "not found" if e.status == 404 else (
            "content too large" if e.status == 413 else "invalid request")
        return problem(e.status, title, e.detail, code="ERR", field=e.field)

    def refused(self, error: str) -> Response:
        """A decision the engine refused, by its RESP error code."""
        code = error.partition(" ")[0]
        status = ERROR_STATUS.get(code, 500)
        headers = []
        if status == 503:
            headers.append(("Retry-After", "1"))
        return problem(status, REASONS.get(status, "error").lower(), error, code=code,
                       headers=headers)

    def batch_error(self, status: int, detail: str, field) -> bytes:
        doc = {"error": {"status": status, "detail": detail}}
        if field is not None:
            doc["error"]["field"] = field
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def describe_rule(self, num: int) -> tuple:
        """(the rule's id as a quoted string, its RateLimit-Policy item or
        None, ms until one more unit of quota, its id as JSON)."""
        registry = self.server.rules
        rule_id = registry.rule_id(num)
        rule = registry.rule_for_num(num)
        name = sf_string(rule_id)
        quota, window_ms, unit_ms = policy_numbers(rule)
        policy = None
        if quota is not None:
            policy = f"{name};q={quota}" + (
                f";w={round(window_ms / 1000)}" if window_ms and window_ms >= 1000 else "")
            if rule.algorithm == "concurrency":
                policy += ';qu="concurrent-requests"'
        return (name.encode("utf-8"), policy.encode("utf-8") if policy else None,
                int(unit_ms), json.dumps(rule_id, ensure_ascii=False).encode("utf-8"))


def count(stats, response: Response, started: int) -> None:
    stats.record(time.perf_counter_ns() - started)
    if response.status >= 400:
        stats.failed_calls += 1


def policy_numbers(rule) -> tuple:
    """(quota, window ms, ms per unit of quota) of a rule's numbers, for
    the RateLimit headers; (None, 0, 0) for a rule that has none."""
    if rule is None:
        return None, 0, 0
    p = rule.params
    if rule.algorithm == "token_bucket":
        refill = p.get("refill_per_second") or p.get("refill")
        period = 1000 if "refill_per_second" in p else p.get("period_ms", 1000)
        unit = period / refill
        return p["capacity"], p["capacity"] * unit, unit
    if rule.algorithm in ("fixed_window", "sliding_window"):
        window = p["window_ms"]
        return p["limit"], window, window if rule.algorithm == "fixed_window" \
            else window / p["limit"]
    if rule.algorithm == "gcra":
        return p["count"], p["period_ms"], p["period_ms"] / p["count"]
    if rule.algorithm == "concurrency":
        return p["limit"], 0, 0
    return None, 0, 0


def route_command(method: str, path: str) -> tuple[bytes, ...] | None:
    """The RESP command a route stands for in ACL rules, as its words."""
    if path.startswith("/v1/"):
        path = path[3:]
    if path == "/rules":
        return (b"cl.rule", b"list") if method == "GET" else None
    if path.startswith("/rules/"):
        sub = {"GET": b"get", "PUT": b"set", "DELETE": b"del"}.get(method)
        return (b"cl.rule", sub) if sub else None
    if path in ("/metrics", "/info") or path.startswith("/status"):
        return (b"info",)
    return None
