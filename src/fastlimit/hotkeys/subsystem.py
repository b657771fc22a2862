"""The hot-key tracker's life in the server: continuous tracking by the
settings (hotkeys-top-k counters, one check in hotkeys-sample, counts
halved every DEFAULT_HALF_LIFE_MS so rates follow the recent past), and
HOTKEYS sessions, which take the tracker over (their own COUNT and SAMPLE,
nothing decays, DURATION) until HOTKEYS RESET gives it back.

The tracker is ServerCore.hotkeys (_hotkeys.pyx over fl_hotkeys.h): the
check path feeds it in C and this only reconfigures and reads it, so
nothing here is on a check's way.  Its memory is fixed by its counters
(INFO memory ``hotkeys_tracker_bytes``), whatever the number of keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastlimit._hotkeys import DEFAULT_HALF_LIFE_MS
from fastlimit.hotkeys import report
from fastlimit.server.subsystem import Subsystem


class HotKeysSubsystem(Subsystem):
    def __init__(self, server):
        self.server = server
        self.core = server.core
        self.tracker = server.core.hotkeys
        self.top_k = self.tracker.k
        self.sample = self.tracker.sample
        self.metrics_keys = 0
        # A HOTKEYS START session holds the tracker (running, or stopped or
        # past its DURATION with its counts kept) until HOTKEYS RESET.
        self.session = False
        self.stopped = False      # HOTKEYS STOP froze continuous tracking

    # ---- the subsystem's calls ------------------------------------------------

    def apply_settings(self, settings) -> None:
        self.metrics_keys = settings.hotkeys_metrics_keys
        changed = (settings.hotkeys_top_k, settings.hotkeys_sample) != (self.top_k, self.sample)
        self.top_k, self.sample = settings.hotkeys_top_k, settings.hotkeys_sample
        # A session or a frozen tracker keeps its counts: the new values
        # apply from HOTKEYS RESET on.
        if changed and not self.session and not self.stopped:
            self.continuous()

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        t = self.tracker
        out: dict[str, dict] = {
            "stats": {"hotkeys_tracking": int(self.active), "hotkeys_sampled_checks": t.sampled},
            "memory": {"hotkeys_tracker_bytes": t.nbytes},
        }
        if "hotkeys" in sections:
            now = self.now_ms()
            es = self.entries(now)
            out["hotkeys"] = {
                "hotkeys_tracking": int(self.active), "hotkeys_mode": self.mode,
                "hotkeys_top_k": t.k, "hotkeys_sample": t.sample,
                "hotkeys_half_life_ms": t.half_life_ms,
                "hotkeys_collection_start_ms": t.start_ms,
                "hotkeys_collection_duration_ms": self.duration_ms(now),
                "hotkeys_checks": t.checks, "hotkeys_sampled_checks": t.sampled,
                "hotkeys_tracked": len(es), "hotkeys_tracker_bytes": t.nbytes,
                **report.info_lines(es),
            }
        return out

    # ---- state --------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.core.clock.now()

    def continuous(self) -> None:
        """Continuous tracking by the settings, counts forgotten."""
        self.session = self.stopped = False
        self.tracker.configure(self.top_k, self.sample, DEFAULT_HALF_LIFE_MS, self.now_ms())

    @property
    def active(self) -> bool:
        """Whether checks are being counted (a session that ran past its
        DURATION is not)."""
        self.tracker.advance(self.now_ms())
        return self.tracker.active

    @property
    def mode(self) -> str:
        if self.session:
            return "session" if self.active else "session-stopped"
        if self.stopped:
            return "stopped"
        return "continuous" if self.tracker.k else "off"

    def duration_ms(self, now_ms: int) -> int:
        t = self.tracker
        return max(0, (now_ms if self.active else t.stopped_ms) - t.start_ms)

    def entries(self, now_ms: int, limit: int | None = None) -> list[report.Entry]:
        carried = self.server.rules.carried() if self.server.rules is not None else {}
        return report.entries(
            self.tracker, now_ms, self.server.rule_id,
            lambda num: carried[num][2] if num in carried else None, limit)

    def snapshot(self, limit: int) -> dict:
        """The status page's part of /v1/stats: the `limit` hottest keys."""
        t = self.tracker
        return {"mode": self.mode, "top_k": t.k, "sample": t.sample,
                "keys": [report.as_json(e) for e in self.entries(self.now_ms(), limit)]}

    # ---- HOTKEYS --------------------------------------------------------------------

    def begin_session(self, count: int, sample: int, duration_ms: int) -> None:
        """A session; the caller checked that none is running."""
        self.session, self.stopped = True, False
        self.tracker.start(count, sample, duration_ms, self.now_ms())

    def stop_tracking(self) -> None:
        self.tracker.stop(self.now_ms())
        if not self.session:
            self.stopped = True

    def reset_tracking(self) -> None:
        self.continuous()
