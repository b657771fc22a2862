"""Decision -> HTTP headers and 429 body, exactly, as a table."""

import json

import pytest

from fastlimit.decision import Decision
from fastlimit.middleware import Limit, denied_body, denied_response, quota_headers


def quota(limit, remaining, reset, window=None):
    policy = f'"burst";q={limit}' + (f";w={window}" if window is not None else "")
    return [
        ("X-RateLimit-Limit", str(limit)),
        ("X-RateLimit-Remaining", str(remaining)),
        ("X-RateLimit-Reset", str(reset)),
        ("RateLimit-Policy", policy),
        ("RateLimit", f'"burst";r={remaining};t={reset}'),
    ]


# (decision, window_seconds, expected quota headers)
QUOTA_TABLE = [
    # the worked example's first call: 5 tokens, refill 2/s, 4 left, full in 500 ms
    (Decision(True, 5, 4, 0, 500, "server"), 3, quota(5, 4, 1, 3)),
    (Decision(True, 5, 5, 0, 0, "server"), 3, quota(5, 5, 0, 3)),       # full: resets now
    (Decision(True, 100, 99, 0, 1000, "server"), 60, quota(100, 99, 1, 60)),
    (Decision(True, 100, 50, 0, 1001, "server"), 60, quota(100, 50, 2, 60)),  # rounded up
    (Decision(False, 100, 0, 600, 30_000, "server"), 60, quota(100, 0, 30, 60)),
    (Decision(True, 7, 3, 0, 2500, "server"), None, quota(7, 3, 3)),      # rules: no w
    (Decision(True, 2, 1, 0, 999, "local_fallback"), 1, quota(2, 1, 1, 1)),
    (Decision(True, 2, 1, 0, 1, "local"), 1, quota(2, 1, 1, 1)),
    # the limiter could not be asked: its numbers are no quota, so none is claimed
    (Decision(True, 0, 0, 0, 0, "failed_open"), 60, []),
    (Decision(False, 0, 0, 0, 0, "failed_closed"), 60, []),
]


@pytest.mark.parametrize("decision, window, expected", QUOTA_TABLE)
def test_quota_headers(decision, window, expected):
    assert quota_headers(decision, window) == expected


def body(retry):
    return json.dumps({"error": "rate_limited", "retry_after_seconds": retry}).encode()


# (decision, window_seconds, expected 429 headers, expected body)
DENIED_TABLE = [
    # retry in 500 ms -> 1 s (rounded up, never 0)
    (Decision(False, 5, 0, 500, 2500, "server"), 3,
     [("Content-Type", "application/json"), ("Content-Length", "51"), ("Retry-After", "1")]
     + quota(5, 0, 3, 3), body(1)),
    (Decision(False, 5, 0, 1000, 2500, "server"), 3,
     [("Content-Type", "application/json"), ("Content-Length", "51"), ("Retry-After", "1")]
     + quota(5, 0, 3, 3), body(1)),
    (Decision(False, 5, 0, 1001, 2500, "server"), 3,
     [("Content-Type", "application/json"), ("Content-Length", "51"), ("Retry-After", "2")]
     + quota(5, 0, 3, 3), body(2)),
    # cost 3 with 2 tokens left: remaining stays 2
    (Decision(False, 1000, 2, 3_599_000, 3_599_000, "server"), 3600,
     [("Content-Type", "application/json"), ("Content-Length", "54"), ("Retry-After", "3599")]
     + quota(1000, 2, 3599, 3600), body(3599)),
    # cost above capacity: no wait helps, so no Retry-After and a null in the body
    (Decision(False, 5, 5, -1, 0, "server"), 3,
     [("Content-Type", "application/json"), ("Content-Length", "54")]
     + quota(5, 5, 0, 3), body(None)),
    (Decision(False, 2, 0, 1500, 1500, "local_fallback"), 2,
     [("Content-Type", "application/json"), ("Content-Length", "51"), ("Retry-After", "2")]
     + quota(2, 0, 2, 2), body(2)),
    # the limiter is down and the rule fails closed: 429, retry in 1 s, no quota
    (Decision(False, 0, 0, 0, 0, "failed_closed"), 60,
     [("Content-Type", "application/json"), ("Content-Length", "51"), ("Retry-After", "1")],
     body(1)),
]


@pytest.mark.parametrize("decision, window, headers, expected_body", DENIED_TABLE)
def test_denied_response(decision, window, headers, expected_body):
    assert denied_response(decision, window) == (headers, expected_body)
    assert int(dict(headers)["Content-Length"]) == len(expected_body)


def test_body_is_the_documented_json():
    assert denied_body(Decision(False, 5, 0, 2001, 2500, "server")) == \
        b'{"error": "rate_limited", "retry_after_seconds": 3}'


@pytest.mark.parametrize("limit, window", [
    (Limit(5, 2), 3),                     # 2.5 s to refill, rounded up
    (Limit(100, 100, 60_000), 60),
    (Limit.per_minute(100), 60),
    (Limit.per_second(10, burst=20), 2),
    (Limit.per_hour(1000), 3600),
    (Limit(1, 1000), 1),                  # 1 ms rounds up to a whole second
])
def test_policy_window(limit, window):
    assert limit.window_seconds == window


@pytest.mark.parametrize("args", [(0, 1), (1, 0), (1, 1, 0), (1.5, 1)])
def test_limit_rejects_non_positive_numbers(args):
    with pytest.raises(ValueError):
        Limit(*args)
