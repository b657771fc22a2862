# The hot-key tracker for Python: configure it, start and stop sessions, and
# read its counters (fl_hotkeys.h does the counting, in C).

from libc.stdint cimport int64_t, uint64_t, uint32_t
from libc.string cimport memset

from fastlimit._core cimport fl_wall_ms, fl_mono_ns

DEFAULT_HALF_LIFE_MS = 10_000


cdef class HotKeys:
    """A bounded top-k of the keys checked most often (Space-Saving over one
    check in `sample`): k counters of fixed size, whatever the traffic."""

    def __cinit__(self):
        memset(&self.t, 0, sizeof(fl_hk))
        self.t.countdown = FL_HK_NEVER

    def __init__(self, uint32_t k=32, uint32_t sample=16,
                 int64_t half_life_ms=DEFAULT_HALF_LIFE_MS, int64_t now_ms=0, seed=None):
        self.configure(k, sample, half_life_ms, now_ms, seed)

    def __dealloc__(self):
        fl_hk_free(&self.t)

    def configure(self, uint32_t k, uint32_t sample, int64_t half_life_ms, int64_t now_ms,
                  seed=None):
        """Remakes the tracker (its counts are forgotten): k counters (0 is
        off), one check in `sample` counted, counts halved every
        half_life_ms (0: never, as in a session)."""
        cdef uint64_t s = <uint64_t>(fl_mono_ns() ^ fl_wall_ms()) if seed is None else seed
        if k > FL_HK_MAX_K:
            raise ValueError(f"top-k must be from 0 to {FL_HK_MAX_K}")
        if sample < 1 or sample > FL_HK_MAX_SAMPLE:
            raise ValueError(f"sample must be from 1 to {FL_HK_MAX_SAMPLE}")
        if fl_hk_init(&self.t, k, sample, half_life_ms, now_ms, s) != 0:
            raise MemoryError()

    def start(self, uint32_t k, uint32_t sample, int64_t duration_ms, int64_t now_ms,
              seed=None):
        """A session: counts from now on, nothing decays, and it stops by
        itself after duration_ms (0: when stopped)."""
        self.configure(k, sample, 0, now_ms, seed)
        if duration_ms > 0:
            self.t.end_ms = now_ms + duration_ms

    def stop(self, int64_t now_ms):
        fl_hk_stop(&self.t, now_ms)

    def reset(self, int64_t now_ms):
        fl_hk_reset(&self.t, now_ms)

    def check(self, bytes key, int64_t now_ms, int kind=FL_HK_BUCKET):
        """What the check path does for one check of key."""
        if fl_hk_due(&self.t):
            fl_hk_offer(&self.t, kind, key, len(key), now_ms)

    def count(self, bytes key, int kind=FL_HK_BUCKET):
        """Space-Saving's update for one key, no sampling (for tests)."""
        if self.t.k:
            fl_hk_count(&self.t, kind, key, len(key))

    def entries(self, int64_t now_ms):
        """The counters, most counted first: (kind, key prefix, full length,
        count, error); count - error <= true sampled checks <= count."""
        cdef uint32_t i
        cdef fl_hk_slot* s
        self.advance(now_ms)
        out = []
        for i in range(self.t.n):
            s = &self.t.slots[i]
            out.append((s.kind, s.key[:min(s.len, FL_HK_KEY_MAX)], s.len, s.count, s.error))
        out.sort(key=lambda e: (-e[3], e[1]))
        return out

    def advance(self, int64_t now_ms):
        """Brings the counts and the time they cover to now_ms (a session
        past its end stops there)."""
        fl_hk_expire(&self.t, now_ms)
        if self.t.active:
            fl_hk_advance(&self.t, now_ms)

    def covered_ms(self, int64_t now_ms):
        """The time the counts cover (halved with them in continuous mode)."""
        self.advance(now_ms)
        return fl_hk_covered(&self.t)

    @property
    def k(self):
        return self.t.k

    @property
    def used(self):
        return self.t.n

    @property
    def sample(self):
        return self.t.sample

    @property
    def active(self):
        return bool(self.t.active) and self.t.k > 0

    @property
    def half_life_ms(self):
        return self.t.half_life_ms

    @property
    def start_ms(self):
        return self.t.start_ms

    @property
    def end_ms(self):
        return None if self.t.end_ms == FL_HK_NEVER else self.t.end_ms

    @property
    def stopped_ms(self):
        return self.t.stopped_ms

    @property
    def checks(self):
        """Checks seen since the start, up to the last sampled one."""
        return self.t.checks

    @property
    def sampled(self):
        return self.t.sampled

    @property
    def nbytes(self):
        """What the tracker holds in memory: fixed by k."""
        return fl_hk_bytes(self.t.k)

    @staticmethod
    def key_max():
        return FL_HK_KEY_MAX


BUCKET = FL_HK_BUCKET    # a bucket key (CL.CHECK, /v1/check/bucket)
RULE = FL_HK_RULE        # a named rule's bucket key, as the engine composes it
KEY_MAX = FL_HK_KEY_MAX  # the bytes of a key a counter keeps
MAX_K = FL_HK_MAX_K
MAX_SAMPLE = FL_HK_MAX_SAMPLE
