# The saturation meter's contract: fl_load.h (the signals, the shed level,
# the shed counters) and LoadMeter, its owner for Python.  The check path
# reads fl_load_sheds; the RESP front calls fl_load_hold / fl_load_release
# for the input it holds back while saturated; nothing here raises.

from libc.stdint cimport int64_t, uint64_t

cdef extern from "fl_load.h":
    enum:
        FL_PRIO_UNSET
        FL_PRIO_LOW
        FL_PRIO_NORMAL
        FL_PRIO_CRITICAL
        FL_PRIO_COUNT
        FL_SHED_REMAINING
        FL_SHED_RETRY_MS
    int64_t FL_LOAD_DRAIN_NS
    int64_t FL_LOAD_PROBE_NS

    ctypedef struct fl_load:
        int level
        int forced
        int threshold_pct
        int64_t lag_ns
        int64_t normal_lag_ns
        int busy_pct
        int64_t last_lag_ns
        int64_t last_wait_ns
        int64_t pending_bytes
        int64_t pending_conns
        uint64_t deferrals
        int64_t level_since_ns
        uint64_t level_changes
        uint64_t shed[3][2]

    void fl_load_init(fl_load* l) noexcept nogil
    void fl_load_begin(fl_load* l) noexcept nogil
    int fl_priority_parse(const char* p, size_t n) noexcept nogil
    bint fl_load_sheds(const fl_load* l, int priority) noexcept nogil
    void fl_load_probe(fl_load* l) noexcept nogil
    void fl_load_window(fl_load* l, int64_t now, int busy_pct, int64_t lag_ns,
                        int64_t wait_ns) noexcept nogil
    void fl_load_hold(fl_load* l, int64_t n) noexcept nogil
    void fl_load_release(fl_load* l, int64_t n, int64_t wait_ns) noexcept nogil
    void fl_load_count_shed(fl_load* l, int priority, int allowed) noexcept nogil


cdef class LoadMeter:
    """The server's meter (ServerCore.load_meter; the check path reaches
    its struct through ServerCore.load)."""
    cdef fl_load l
