"""HTTP middleware that turns fastlimit decisions into the responses clients
expect: ``429 Too Many Requests`` with ``Retry-After`` and the rate-limit
headers, and quota headers on every allowed response.

No framework is imported: ``RateLimitMiddleware`` is pure ASGI and
``WSGIRateLimitMiddleware`` is plain WSGI.
"""

from fastlimit.middleware.asgi import RateLimitMiddleware
from fastlimit.middleware.headers import (
    ceil_seconds,
    denied_body,
    denied_response,
    quota_headers,
    retry_after_seconds,
)
from fastlimit.middleware.policy import Limit, RateLimitPolicy, Rules
from fastlimit.middleware.request import (
    Request,
    client_ip,
    first_of,
    header_key,
    method_and_route,
    resolve_client_ip,
    user_key,
)
from fastlimit.middleware.wsgi import WSGIRateLimitMiddleware

__all__ = [
    "Limit",
    "RateLimitMiddleware",
    "RateLimitPolicy",
    "Request",
    "Rules",
    "WSGIRateLimitMiddleware",
    "ceil_seconds",
    "client_ip",
    "denied_body",
    "denied_response",
    "first_of",
    "header_key",
    "method_and_route",
    "quota_headers",
    "resolve_client_ip",
    "retry_after_seconds",
    "user_key",
]
