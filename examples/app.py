"""A small Starlette API behind fastlimit's ASGI middleware.

Start it (fastlimit-server and this app) with one command, from the repo root:

    examples/run.sh

then watch the 429s arrive:

    curl -i localhost:8000/hello          # run it 6 times quickly: the 6th is a 429
    curl -i -H 'X-Api-Key: demo-paid-key' localhost:8000/hello   # the paid tier: 50 at once

Limits: 5 requests at once per client, refilled at 1 per second (paid keys:
50, refilled at 10 per second). Clients are API keys when sent, else IP
addresses. /health is never limited. POST /login fails closed: if the
fastlimit server is down, logins are refused (429, Retry-After: 1) while
/hello stays up (fails open).
"""

import contextlib
import os

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fastlimit.client import AsyncClient
from fastlimit.middleware import Limit, RateLimitMiddleware, client_ip, first_of, header_key

# A stand-in for a real API-key store.
API_KEY_TIERS = {"demo-paid-key": "paid"}

limiter = AsyncClient(servers=os.environ.get("FASTLIMIT_SERVERS", "127.0.0.1:6380"))


async def hello(request):
    return JSONResponse({"hello": "world"})


async def login(request):
    return JSONResponse({"welcome": True})


async def health(request):
    return JSONResponse({"ok": True})


api_key_or_ip = first_of(header_key("x-api-key"), client_ip())


def client_key(request):
    if request.path == "/health":
        return None                      # None: not limited at all
    return api_key_or_ip(request)


def tier(request):
    return API_KEY_TIERS.get(request.header("x-api-key") or "")


def on_failure(request):
    # Security limits deny while the limiter is down; product limits allow.
    return "closed" if request.path == "/login" else "open"


@contextlib.asynccontextmanager
async def lifespan(app):
    yield
    await limiter.aclose()


app = Starlette(
    routes=[Route("/hello", hello), Route("/login", login, methods=["POST"]),
            Route("/health", health)],
    lifespan=lifespan,
)
app.add_middleware(
    RateLimitMiddleware,
    limiter=limiter,
    limit={None: Limit(capacity=5, refill_per_sec=1),
           "paid": Limit(capacity=50, refill_per_sec=10)},
    key=client_key,
    tier=tier,
    on_failure=on_failure,
)
