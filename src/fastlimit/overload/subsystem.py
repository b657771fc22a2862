"""The saturation meter's life in the server: its settings, a probe every
PROBE_INTERVAL_S (how late it fires is the loop's lag, and each probe
lets the meter close its window), the log of level changes (at most one
line a second), and the figures INFO, /metrics and the status page show.

The meter is ServerCore.load_meter (_load.pyx over fl_load.h): the check
path reads its level in C and this only configures and reads it, so
nothing here is on a check's way.  Its state is fixed in size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from fastlimit._load import PRIORITIES, PROBE_INTERVAL_S
from fastlimit.server.subsystem import Subsystem

LEVEL_NAMES = ("none", "low", "low+normal")
LOG_INTERVAL_S = 1.0


class Overload(Subsystem):
    def __init__(self, server, log):
        self.server = server
        self.log = log
        self.meter = server.core.load_meter
        self._probe: asyncio.TimerHandle | None = None
        self._logged_level = 0
        self._logged_at = 0.0

    # ---- the subsystem's calls ------------------------------------------------

    def apply_settings(self, settings) -> None:
        self.meter.configure(settings.shed_threshold, settings.shed_lag_ms,
                             settings.shed_normal_lag_ms)

    async def start(self) -> None:
        self.meter.begin()
        self._probe = asyncio.get_running_loop().call_later(PROBE_INTERVAL_S, self.probe)

    def probe(self) -> None:
        self.meter.probe()
        self.note_level()
        self._probe = asyncio.get_running_loop().call_later(PROBE_INTERVAL_S, self.probe)

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        counts = self.meter.shed_counts()
        out: dict[str, dict] = {"stats": {
            f"shed_checks_{name}": sum(counts[name]) for name in PRIORITIES[:2]}}
        if "shedding" in sections:
            f = self.meter.figures()
            out["shedding"] = {
                "shed_level": f["level"], "shed_level_name": LEVEL_NAMES[f["level"]],
                "shed_level_forced": f["forced"], "shed_busy_percent": f["busy_percent"],
                "shed_loop_lag_us": f["lag_us"], "shed_wait_us": f["wait_us"],
                "shed_pending_bytes": f["pending_bytes"],
                "shed_pending_connections": f["pending_connections"],
                "shed_deferred_reads": f["deferrals"], "shed_level_changes": f["level_changes"],
                **{f"shed_checks_{name}": "allowed={},denied={}".format(*counts[name])
                   for name in PRIORITIES},
            }
        return out

    # ---- the log ---------------------------------------------------------------------

    def note_level(self) -> None:
        """One line when the level changed, at most one a second: a node
        whose load hovers at the threshold must not flood its log."""
        level = self.meter.level
        if level == self._logged_level:
            return
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL_S:
            return
        self._logged_at, self._logged_level = now, level
        f = self.meter.figures()
        counts = self.meter.shed_counts()
        what = f"shedding {LEVEL_NAMES[level]} checks" if level else "no longer shedding"
        self.log.warning(
            "overload: %s (busy %d%%, loop lag %d us, held-back input waited %d us); shed so "
            "far: low %d, normal %d", what, f["busy_percent"], f["lag_us"], f["wait_us"],
            sum(counts["low"]), sum(counts["normal"]))
