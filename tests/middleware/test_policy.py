"""RateLimitPolicy: which limiter call a request becomes, and the
configuration errors caught at start-up."""

import pytest

from fastlimit.decision import Decision
from fastlimit.middleware import Limit, RateLimitPolicy, Rules, header_key
from fastlimit.middleware.request import AsgiRequest

ALLOW = Decision(True, 1, 0, 0, 1000, "server")


class RecordingLimiter:
    """Records calls; stands in for a Client where only the arguments matter."""

    def __init__(self):
        self.calls = []

    def check(self, *args, **kwargs):
        self.calls.append(("check", args, kwargs))
        return ALLOW

    def limit(self, *args, **kwargs):
        self.calls.append(("limit", args, kwargs))
        return ALLOW


def http(path="/orders", method="POST", headers=(), peer="203.0.113.5"):
    return AsgiRequest({"type": "http", "method": method, "path": path,
                        "client": (peer, 4000),
                        "headers": [(k.encode(), v.encode()) for k, v in headers]})


def test_fixed_limit_calls_check_with_resource_and_client_in_the_key():
    limiter = RecordingLimiter()
    policy = RateLimitPolicy(limiter, Limit(20, 10, 2000), on_failure="closed")
    pending = policy.start(http())
    assert pending == (ALLOW, 4)
    assert limiter.calls == [("check", ("POST /orders|ip:203.0.113.5", 20, 10),
                              {"cost": 1, "period_ms": 2000, "on_failure": "closed"})]


def test_tier_mapping_selects_the_limit_and_unknown_tiers_get_the_default():
    limiter = RecordingLimiter()
    policy = RateLimitPolicy(limiter, {None: Limit(10, 1), "paid": Limit(100, 10)},
                             tier=lambda req: req.header("x-tier"))
    for tier in ("paid", "gold", None):
        policy.start(http(headers=[("x-tier", tier)] if tier else []))
    assert [call[1][1:] for call in limiter.calls] == [(100, 10), (10, 1), (10, 1)]


def test_rules_call_limit_with_client_resource_tier_and_cost():
    limiter = RecordingLimiter()
    policy = RateLimitPolicy(limiter, Rules(), key=header_key("x-api-key", prefix="key:",
                                                              hashed=False),
                             tier=lambda req: "free", cost=lambda req: 3)
    pending = policy.start(http(headers=[("X-Api-Key", "acme")]))
    assert pending == (ALLOW, None)   # the window of server rules is not known here
    assert limiter.calls == [("limit", ("key:acme", "POST /orders"),
                              {"tier": "free", "cost": 3, "on_failure": "open"})]
    assert RateLimitPolicy(limiter, Rules(window_seconds=60)).start(http()).window_seconds == 60


def test_no_key_means_no_call():
    limiter = RecordingLimiter()
    assert RateLimitPolicy(limiter, Limit(1, 1), key=lambda req: None).start(http()) is None
    assert limiter.calls == []


@pytest.mark.parametrize("limit, error", [
    ({"paid": Limit(1, 1)}, ValueError),        # no default (None) entry
    ({None: (10, 1)}, TypeError),
    ((10, 1), TypeError),
])
def test_bad_limits_fail_at_start_up(limit, error):
    with pytest.raises(error):
        RateLimitPolicy(RecordingLimiter(), limit)


def test_bad_failure_mode_fails_at_start_up():
    with pytest.raises(ValueError, match="on_failure"):
        RateLimitPolicy(RecordingLimiter(), Limit(1, 1), on_failure="maybe")
