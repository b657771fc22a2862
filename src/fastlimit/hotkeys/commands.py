"""HOTKEYS (Redis 8.6's syntax, on the tracker of hotkeys/subsystem.py):

    HOTKEYS START METRICS count OPS [COUNT k] [DURATION s] [SAMPLE ratio]
    HOTKEYS STOP | GET | RESET | HELP

Metrics: OPS, checks per second (what a limiter's hot key costs).  Redis's
CPU and NET are refused with an error saying so, and so is SLOTS.  GET
answers as Redis does, a one-element array of the fields (a map on RESP3),
with Redis's tracking-active, sample-ratio, selected-slots,
collection-start-time-unix-ms and collection-duration-ms, and fastlimit's
mode, top-k, checks, sampled-checks, half-life-ms, by-ops ([name, checks
per second, ...], most checked first) and by-ops-detail (one map per
entry: its parts apart and Space-Saving's bounds).  Continuous tracking
(hotkeys-top-k, hotkeys-sample) is on by default, so GET answers without a
START; a session takes the tracker over until RESET gives it back.
"""

from __future__ import annotations

from fastlimit._hotkeys import MAX_K, MAX_SAMPLE
from fastlimit._resp import ReplyError
from fastlimit.server.arguments import integer

MAX_DURATION_S = 1_000_000
METRICS = {b"ops": "OPS", b"cpu": "CPU", b"net": "NET"}


def _hotkeys(conn):
    return conn.core.app.hotkeys


def _start_options(args: list[bytes]) -> tuple[int, int, int]:
    """START's (count, sample, duration_ms), Redis's order of checks and texts."""
    if len(args) < 3 or args[2].lower() != b"metrics":
        raise ReplyError("ERR METRICS parameter is required")
    if len(args) < 4:
        raise ReplyError("ERR syntax error")
    n = integer(args[3])
    if n <= 0 or n > len(METRICS):
        raise ReplyError(f"ERR METRICS count must be > 0 and <= {len(METRICS)}")
    names = [a.lower() for a in args[4:4 + n]]
    if len(names) < n or any(m not in METRICS for m in names):
        raise ReplyError("ERR METRICS count does not match number of metric types provided")
    if len(set(names)) < len(names):
        raise ReplyError(f"ERR METRICS {METRICS[names[0]]} defined more than once!")
    unsupported = [METRICS[m] for m in names if m != b"ops"]
    if unsupported:
        raise ReplyError(f"ERR METRICS {unsupported[0]} is not supported by fastlimit: "
                         "it ranks keys by checks per second (METRICS 1 OPS)")
    count, sample, duration_ms = 32, 1, 0
    i = 4 + n
    while i < len(args):
        opt = args[i].lower()
        if opt == b"slots":
            raise ReplyError("ERR SLOTS is not supported by fastlimit's HOTKEYS")
        if opt not in (b"count", b"duration", b"sample") or i + 1 >= len(args):
            raise ReplyError("ERR syntax error")
        value = integer(args[i + 1])
        if opt == b"count":
            if not 1 <= value <= MAX_K:
                raise ReplyError(f"ERR COUNT must be between 1 and {MAX_K}")
            count = value
        elif opt == b"duration":
            if not 1 <= value <= MAX_DURATION_S:
                raise ReplyError(f"ERR DURATION must be between 1 and {MAX_DURATION_S}")
            duration_ms = value * 1000
        else:
            if value < 1:
                raise ReplyError("ERR SAMPLE ratio must be positive")
            if value > MAX_SAMPLE:
                raise ReplyError(f"ERR SAMPLE ratio must be at most {MAX_SAMPLE}")
            sample = value
        i += 2
    return count, sample, duration_ms


def cmd_hotkeys_start(conn, args):
    hk = _hotkeys(conn)
    if hk.session and hk.active:
        raise ReplyError("ERR hotkey tracking session already in progress")
    hk.begin_session(*_start_options(args))
    return b"OK"


def cmd_hotkeys_stop(conn, args):
    _hotkeys(conn).stop_tracking()
    return b"OK"


def cmd_hotkeys_reset(conn, args):
    hk = _hotkeys(conn)
    if hk.session and hk.active:
        raise ReplyError("ERR hotkey tracking session in progress, stop tracking first")
    hk.reset_tracking()
    return b"OK"


def cmd_hotkeys_get(conn, args):
    hk = _hotkeys(conn)
    if hk.mode == "off":
        return None
    t = hk.tracker
    now = hk.now_ms()
    es = hk.entries(now)
    by_ops: list = []
    detail = []
    for e in es:
        by_ops += [e.name, round(e.ops)]
        item = {"key": e.name, "source": e.source, "ops": round(e.ops),
                "ops-min": round(e.ops_min), "count": e.count, "error": e.error,
                "truncated": int(e.truncated)}
        if e.rule is not None:
            item.update({"rule": e.rule, "client": e.client or b""})
            if e.resource is not None:
                item["resource"] = e.resource
        detail.append(item)
    return [{
        "tracking-active": int(hk.active),
        "sample-ratio": t.sample,
        "selected-slots": [],
        "collection-start-time-unix-ms": t.start_ms,
        "collection-duration-ms": hk.duration_ms(now),
        "mode": hk.mode,
        "top-k": t.k,
        "checks": t.checks,
        "sampled-checks": t.sampled,
        "half-life-ms": t.half_life_ms,
        "by-ops": by_ops,
        "by-ops-detail": detail,
    }]
