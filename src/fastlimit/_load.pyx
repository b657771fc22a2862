# The saturation meter for Python: its settings, the probe the overload
# subsystem calls, DEBUG SHED-LEVEL, and its figures (fl_load.h measures
# and decides, in C).

from libc.stdint cimport int64_t

# A priority's value is its index: the names every front and document use.
PRIORITIES = ("low", "normal", "critical")
PROBE_INTERVAL_S = FL_LOAD_PROBE_NS / 1e9
SHED_REMAINING = FL_SHED_REMAINING
SHED_RETRY_MS = FL_SHED_RETRY_MS


def priority_value(name):
    """The value of a priority's name (str or bytes, any case), or None."""
    cdef bytes b = name.encode("utf-8", "replace") if isinstance(name, str) else bytes(name)
    cdef int p = fl_priority_parse(b, len(b))
    return None if p == FL_PRIO_UNSET else p


cdef class LoadMeter:
    """The node's saturation: busy share, loop lag, held-back input, and
    the shed level they set (fl_load.h)."""

    def __cinit__(self):
        fl_load_init(&self.l)

    def configure(self, int threshold_pct, int64_t lag_ms, int64_t normal_lag_ms):
        """shed-threshold (0: off), shed-lag-ms, shed-normal-lag-ms."""
        self.l.threshold_pct = threshold_pct
        self.l.lag_ns = lag_ms * 1000000
        self.l.normal_lag_ns = normal_lag_ms * 1000000
        if threshold_pct <= 0 and self.l.forced < 0:
            self.l.level = 0

    def begin(self):
        """Starts measuring from now (the probes' first call)."""
        fl_load_begin(&self.l)

    def probe(self):
        """The probe timer's call: measures, and closes a window when due."""
        fl_load_probe(&self.l)

    def window(self, int64_t now_ms, int busy_percent, int64_t lag_ms, int64_t wait_ms):
        """One closed window's signals at now_ms (the probe measures them):
        the level's step on a clock of the caller's."""
        fl_load_window(&self.l, now_ms * 1000000, busy_percent, lag_ms * 1000000,
                       wait_ms * 1000000)

    def force(self, int level):
        """DEBUG SHED-LEVEL: 0..2 holds that level; -1 measures again."""
        if not -1 <= level <= 2:
            raise ValueError("the level must be 0, 1, 2 or -1")
        self.l.forced = level
        if level >= 0:
            self.l.level = level

    def shed(self, int priority, bint allowed=True):
        """Whether a check of this priority (an index of PRIORITIES) is
        shed now; one that is is counted, with its outcome."""
        if not fl_load_sheds(&self.l, priority):
            return False
        fl_load_count_shed(&self.l, priority, allowed)
        return True

    @property
    def level(self):
        return self.l.level

    @property
    def forced(self):
        return self.l.forced >= 0

    def shed_counts(self):
        """{priority name: (shed and allowed, shed and denied)}."""
        return {name: (self.l.shed[i][1], self.l.shed[i][0])
                for i, name in enumerate(PRIORITIES)}

    def figures(self):
        """What INFO, /metrics and the status page show."""
        return {"level": self.l.level, "forced": int(self.l.forced >= 0),
                "busy_percent": self.l.busy_pct,
                "lag_us": self.l.last_lag_ns // 1000, "wait_us": self.l.last_wait_ns // 1000,
                "pending_bytes": self.l.pending_bytes,
                "pending_connections": self.l.pending_conns,
                "deferrals": self.l.deferrals, "level_changes": self.l.level_changes}
