# The hot-key tracker's contract: fl_hotkeys.h (Space-Saving top-k over a
# sample of the checks, fixed memory) and HotKeys, its owner for Python.
# The check path (check_bucket, RuleEngine.evaluate) calls fl_hk_due on every check and
# fl_hk_begin / fl_hk_count on a sampled one; nothing here raises.

from libc.stdint cimport int64_t, uint64_t, uint32_t, uint16_t, uint8_t

cdef extern from "fl_hotkeys.h":
    enum:
        FL_HK_KEY_MAX
        FL_HK_MAX_K
        FL_HK_MAX_SAMPLE
        FL_HK_BUCKET      # a bucket key (CL.CHECK, /v1/check/bucket)
        FL_HK_RULE        # a named rule's bucket key (CL.LIMIT, /v1/check)
    int64_t FL_HK_NEVER

    ctypedef struct fl_hk_slot:
        uint64_t hash
        uint64_t count
        uint64_t error
        uint32_t len
        uint8_t kind
        char key[FL_HK_KEY_MAX]

    ctypedef struct fl_hk:
        int64_t countdown
        uint32_t k
        uint32_t n
        uint32_t sample
        int active
        int64_t half_life_ms
        int64_t start_ms
        int64_t end_ms
        int64_t stopped_ms
        int64_t covered_ms
        uint64_t checks
        uint64_t sampled
        fl_hk_slot* slots

    size_t fl_hk_bytes(uint32_t k) nogil
    int fl_hk_init(fl_hk* t, uint32_t k, uint32_t sample, int64_t half_life_ms,
                   int64_t now_ms, uint64_t seed) nogil
    void fl_hk_free(fl_hk* t) nogil
    void fl_hk_reset(fl_hk* t, int64_t now_ms) nogil
    int fl_hk_due(fl_hk* t) nogil
    int fl_hk_begin(fl_hk* t, int64_t now_ms) nogil
    void fl_hk_count(fl_hk* t, uint8_t kind, const char* key, size_t len) nogil
    void fl_hk_offer(fl_hk* t, uint8_t kind, const char* key, size_t len, int64_t now_ms) nogil
    void fl_hk_advance(fl_hk* t, int64_t now_ms) nogil
    int64_t fl_hk_covered(const fl_hk* t) nogil
    void fl_hk_expire(fl_hk* t, int64_t now_ms) nogil
    void fl_hk_stop(fl_hk* t, int64_t now_ms) nogil


cdef class HotKeys:
    """One tracker (the server's is ServerCore.hotkeys; the check path
    reaches its struct through ServerCore.hot)."""
    cdef fl_hk t
