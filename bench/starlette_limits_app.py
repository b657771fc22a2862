#!/usr/bin/env python3
"""What a Python team would build instead of fastlimit's HTTP check: a
Starlette app on uvicorn that checks the same rules through the ``limits``
library against a real redis-server.  bench/http_front.py starts it, side by side
with fastlimit's ``POST /v1/check``.

    python bench/starlette_limits_app.py --port 8000 --redis-url redis://127.0.0.1:6379 \\
        --rules '{"items": {"resource": "GET /api/items", "limit": 1000, "window_ms": 1000}}'

Routes:
  POST /v1/check           ``{"client_key", "resource", "cost"?}`` → the same JSON
                           as fastlimit's: ``allowed, limit, remaining,
                           retry_after_ms, reset_after_ms, rule``; 200 for a
                           denial too.  ``hit`` then ``get_window_stats``: the
                           two calls Flask-Limiter and SlowAPI make when they
                           send rate-limit headers (three Redis round trips
                           with the fixed window).
  POST /v1/check/hit-only  the same check answering only ``allowed, limit,
                           rule`` (one ``hit``: one round trip), the strongest
                           form of this stack, which answers less.
  GET  /stats              ``{"allowed", "denied"}`` since the start, for the
                           bench's allowed share.

A rule matches one resource exactly (a dict lookup, as a team would
write it); a resource with no rule is allowed with limit and remaining -1,
as fastlimit answers.  uvicorn runs one worker with uvloop and httptools when
they are importable, and no access log.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import limits
import limits.aio.storage
import limits.aio.strategies
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

STRATEGIES = {
    "fixed_window": limits.aio.strategies.FixedWindowRateLimiter,
    "sliding_window": limits.aio.strategies.SlidingWindowCounterRateLimiter,
    "moving_window": limits.aio.strategies.MovingWindowRateLimiter,
}
MAX_BODY = 65536


class BadRequest(Exception):
    pass


def rate_item(rule_id: str, rule: dict) -> limits.RateLimitItem:
    """limits counts windows in whole seconds."""
    window_ms = int(rule["window_ms"])
    if window_ms % 1000:
        raise ValueError(f"rule {rule_id}: window_ms must be whole seconds for limits")
    return limits.RateLimitItemPerSecond(int(rule["limit"]), window_ms // 1000)


def parse_check(body: bytes) -> tuple[str, str, int]:
    if len(body) > MAX_BODY:
        raise BadRequest("body too large")
    try:
        doc = json.loads(body)
    except ValueError:
        raise BadRequest("body is not JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    key, resource, cost = doc.get("client_key"), doc.get("resource"), doc.get("cost", 1)
    if not isinstance(key, str) or not key:
        raise BadRequest("client_key must be a non-empty string")
    if not isinstance(resource, str):
        raise BadRequest("resource must be a string")
    if type(cost) is not int or cost < 0:
        raise BadRequest("cost must be a non-negative integer")
    return key, resource, cost


def build_app(rules: dict, redis_url: str, strategy: str) -> Starlette:
    storage = limits.aio.storage.RedisStorage(
        redis_url.replace("redis://", "async+redis://", 1), implementation="redispy")
    limiter = STRATEGIES[strategy](storage)
    by_resource = {r["resource"]: (rule_id, rate_item(rule_id, r))
                   for rule_id, r in rules.items()}
    counts = {"allowed": 0, "denied": 0}

    async def check(request: Request, full: bool) -> JSONResponse:
        try:
            key, resource, cost = parse_check(await request.body())
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        found = by_resource.get(resource)
        if found is None:
            return JSONResponse({"allowed": True, "limit": -1, "remaining": -1,
                                 "retry_after_ms": 0, "reset_after_ms": 0, "rule": None})
        rule_id, item = found
        allowed = await limiter.hit(item, rule_id, key, cost=cost)
        counts["allowed" if allowed else "denied"] += 1
        if not full:
            return JSONResponse({"allowed": allowed, "limit": item.amount, "rule": rule_id})
        stats = await limiter.get_window_stats(item, rule_id, key)
        reset_ms = max(0, math.ceil((stats.reset_time - time.time()) * 1000))
        return JSONResponse({"allowed": allowed, "limit": item.amount,
                             "remaining": stats.remaining,
                             "retry_after_ms": 0 if allowed else reset_ms,
                             "reset_after_ms": reset_ms, "rule": rule_id})

    async def check_full(request: Request) -> JSONResponse:
        return await check(request, True)

    async def check_hit_only(request: Request) -> JSONResponse:
        return await check(request, False)

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(counts)

    return Starlette(routes=[
        Route("/v1/check", check_full, methods=["POST"]),
        Route("/v1/check/hit-only", check_hit_only, methods=["POST"]),
        Route("/stats", stats, methods=["GET"]),
    ])


def importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def main(argv=None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--rules", required=True,
                   help='JSON: {"rule_id": {"resource", "limit", "window_ms"}}')
    p.add_argument("--strategy", choices=sorted(STRATEGIES), default="fixed_window")
    args = p.parse_args(argv)
    app = build_app(json.loads(args.rules), args.redis_url, args.strategy)
    loop = "uvloop" if importable("uvloop") else "asyncio"
    http = "httptools" if importable("httptools") else "h11"
    print(f"starlette_limits_app: uvicorn {uvicorn.__version__}, loop {loop}, http {http}, "
          f"limits {limits.__version__} {args.strategy}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, loop=loop, http=http,
                access_log=False, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
