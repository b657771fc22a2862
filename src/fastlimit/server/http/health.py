"""Health and INFO for probes and scripts: /livez (the process answers;
/healthz is its alias), /readyz (ready for checks), /healthcheck
(envoyproxy/ratelimit's probe) and /v1/info."""

from __future__ import annotations

from fastlimit.server.http.routes import Response, json_response
from fastlimit.server.info import info_dict


def livez(req) -> Response:
    return Response(200, b"ok\n", "text/plain; charset=utf-8")


def readiness(server) -> list[tuple[str, bool, str]]:
    """(check, ok, why not) for each condition of readiness: a replica
    has its copy of the primary, a PostgreSQL rules-store has not been out
    of reach longer than rules-store-max-staleness, a cluster node knows
    who serves every slot.  Rules and the snapshot are loaded before the
    port opens."""
    checks = [("loaded", True, "")]
    if server.core.readonly:
        fields = server.subsystem_info(frozenset(["replication"]), frozenset()).get(
            "replication", {})
        synced = fields.get("master_link_status") == "up" and \
            not fields.get("master_sync_in_progress")
        checks.append(("replication", synced, "the replica has no copy of its primary yet"))
    if server.rules_store is not None:
        checks.append(("rules-store", *server.rules_store.ready()))
    if server.cluster.enabled:
        checks.append(("cluster", server.cluster.state() == "ok",
                       "some slots have no known primary"))
    return checks


def readyz(req) -> Response:
    checks = readiness(req.server)
    ready = all(ok for _, ok, _ in checks)
    if "verbose" in req.query:
        lines = [f"[+]{name} ok" if ok else f"[-]{name} failed: {why}"
                 for name, ok, why in checks]
        lines.append("readyz check passed" if ready else "readyz check failed")
        body = ("\n".join(lines) + "\n").encode()
    else:
        body = b"ok\n" if ready else b"not ready\n"
    return Response(200 if ready else 503, body, "text/plain; charset=utf-8")


def healthcheck(req) -> Response:
    """envoyproxy/ratelimit's /healthcheck (src/server/health.go): "OK"
    while serving, 500 with no body once shutdown has begun (SIGTERM),
    while the gRPC front lets its calls finish, so a load balancer stops
    sending before the port closes."""
    if req.server.stopping:
        return Response(500, b"", "text/plain; charset=utf-8")
    return Response(200, b"OK", "text/plain; charset=utf-8")


def info(req) -> Response:
    """INFO as JSON: ?section=a,b as INFO a b (default: everything)."""
    sections = [s for s in req.query.get("section", "").split(",") if s] or ["everything"]
    return json_response(info_dict(req.server.core, sections))


ROUTES = [("GET", "/livez", livez), ("GET", "/healthz", livez), ("GET", "/readyz", readyz),
          ("GET", "/healthcheck", healthcheck), ("GET", "/v1/info", info)]
