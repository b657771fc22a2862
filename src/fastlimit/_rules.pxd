# Named rules in the engine: the algorithms besides the token bucket,
# compiled rule specs, and the all-or-nothing check of several rules.
# Rules are numbered by the Python registry; a number is never reused in
# a process, so buckets of a deleted or replaced rule can never be read
# again.  Bucket keys are <u32 rule number><client key>[\0<resource>];
# a split rule's sub-buckets have the split's epoch in the number's high
# byte and a sub-key (fl_split.h) as their client key.

from libc.stdint cimport int64_t, uint64_t, uint32_t, uint8_t

from fastlimit._core cimport (Table, CheckResult, BucketParams, Clock, MemoryBound,
                              RULE_NUMBER_BITS, RULE_NUMBER_MASK)
from fastlimit._hotkeys cimport HotKeys, fl_hk


cdef enum Algorithm:
    ALG_TOKEN_BUCKET = 0
    ALG_FIXED_WINDOW = 1
    ALG_SLIDING_WINDOW = 2
    ALG_GCRA = 3
    ALG_CONCURRENCY = 4
    N_ALGORITHMS = 5
    N_SHARED_TABLES = 4          # concurrency rules have tables of their own

cdef enum:
    FIXED_WINDOW_VALUE = 16      # i64 count, i64 window start ms
    SLIDING_WINDOW_VALUE = 24    # i64 previous count, i64 current count, i64 window start
    GCRA_VALUE = 16              # i64 theoretical arrival time in ticks of 1/count ms, i64 count
    LEASE_SLOT = 12              # concurrency: i64 lease expiry ms (0 = free), u32 generation
    MAX_CONCURRENCY = 1024       # slots per key, so a record stays small
    MAX_RULES_PER_CHECK = 64
    SPLIT_HISTORY = 3            # earlier splits a rule remembers
    # evaluate(): a split rule in cluster mode, asked with its plain key (its
    # sub-keys live on several shards), or with a rule that is not split
    FL_ESPLIT = -40
    FL_ESPLITMIX = -41
    # evaluate(): a home rule's key lives in another region (home_region),
    # which answers the check; or that region is unreachable
    FL_EHOME = -42
    FL_EHOMEDOWN = -43
    HOME_NONE = -1               # RuleSpec.home: not a home rule
    HOME_BY_KEY = -2             # the key's hash picks its home region
    MAX_REGIONS = 64


cdef struct RuleSpec:
    int algorithm
    bint in_use
    bint shadow
    bint per_resource            # bucket per client and resource
    BucketParams bucket          # token bucket (cost set per call)
    int64_t limit                # windows
    int64_t window_ms
    int64_t burst                # GCRA: max_burst; limit is burst + 1
    int64_t count                # GCRA: arrivals per period
    int64_t period_ms
    int64_t lease_ms             # concurrency: a lease ends by itself after this
    Table* leases                # concurrency: this rule's own table (value = limit slots)
    uint32_t lease_generation    # concurrency: stamps every lease, so ids are never reused
    uint64_t allowed
    uint64_t denied
    uint64_t shadow_denied
    # Split keys (fl_split.h): `split` sub-buckets per key (1: none), whose
    # bucket keys carry split_epoch in the rule number's high byte; the
    # earlier splits (newest first), which a new sub-bucket inherits from.
    int split
    uint32_t split_epoch
    int nprev
    int prev_split[SPLIT_HISTORY]
    uint32_t prev_epoch[SPLIT_HISTORY]
    # Overload (fl_load.h): the priority of the rule's checks (-1: not
    # set) and whether a shed check is denied ("on_failure": "closed").
    int priority
    bint fail_closed
    # Regions ("regions": "global"): the rule's spends are logged for the
    # other regions (RuleEngine.log_spend), which debit them (debit()).
    bint region_sync
    # "regions": "home": the region its keys live in (an index of the
    # regions, HOME_BY_KEY, or HOME_NONE for other rules), unless a key
    # starts with one of home_prefixes: {<u8 region><u16 length><prefix>}*,
    # the longest first (NULL: none; the bytes are RuleEngine.home_tables')
    int home
    const char* home_prefixes
    size_t home_prefixes_len


# The rules as C code outside the engine reads them (by a record's rule
# number): slot routing, and the eviction ranks of the rules' tables.
cdef struct RuleRoute:
    const RuleSpec* rules
    uint32_t nrules


# One algorithm step.  Without commit nothing is stored and the result
# describes the state as it stands.  Return FL_OK or an FL_E* code.
cdef int fixed_window_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                            int64_t cost, int64_t now_ms, bint commit,
                            CheckResult* out) noexcept nogil
cdef int sliding_window_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                              int64_t cost, int64_t now_ms, bint commit,
                              CheckResult* out) noexcept nogil
cdef int gcra_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                    int64_t cost, int64_t now_ms, bint commit,
                    CheckResult* out) noexcept nogil
# Concurrency: takes a free slot (out.reset_after_ms carries the lease id,
# -1 when denied), or frees one.  release returns 1 when the lease was held.
cdef int concurrency_acquire(Table* t, const char* key, size_t keylen, RuleSpec* r,
                             int64_t now_ms, CheckResult* out) noexcept nogil
cdef int concurrency_release(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                             int64_t lease_id, int64_t now_ms) noexcept nogil


cdef extern from "fl_split.h":
    enum:
        FL_SPLIT_MAX
        FL_SPLIT_SUFFIX_MAX
    bint fl_split_parse(const char* key, size_t n, int k, int* index,
                        size_t* suffix_at) noexcept nogil
    size_t fl_split_subkey(const char* base, size_t n, int i, char* out) noexcept nogil
    size_t fl_split_base(const char* key, size_t n, int index, size_t suffix_at,
                         char* out) noexcept nogil
    int64_t fl_split_share(int64_t total, int k, int i) noexcept nogil
    uint64_t fl_split_random(uint64_t* state) noexcept nogil

# Split keys (fl_split.h): the choice of a sub-bucket, shared by split
# rules and CL.CHECK ... SPLIT k, and the refusal of a plain key in
# cluster mode.
# FNV-1a, 64 bits: a home rule's key over the regions, and the rate limit
# service's lookups of its compiled tables (_rls.pyx).
cdef uint64_t fnv1a64(const char* p, size_t n) noexcept nogil

cdef int split_pick(uint64_t* rng, const unsigned char* local_slots, const char* base,
                    size_t n, int k, int other, char* scratch) noexcept
cpdef str split_refused(int k)


cdef class RuleEngine:
    cdef Table tables[N_SHARED_TABLES]   # by Algorithm, shared by the rules using it
    cdef Table throttle_table     # CL.THROTTLE's GCRA buckets (redis-cell keys)
    cdef uint8_t seed[16]
    cdef RuleSpec* rules
    # Each rule's whole numbers, where a global rule's under its partition
    # share differ (what another region's spends are debited against).
    cdef RuleSpec* wholes
    cdef uint32_t nrules          # allocated entries; numbers are indexes
    # rules and nrules for the tables' eviction ranks (their spent_ctx),
    # which need an address that stays put while define() reallocates
    cdef RuleRoute ruleset
    cdef readonly Clock clock
    cdef char* keybuf
    cdef size_t keycap
    # The matcher's answers by resource or (resource, tier) -> (packed nums,
    # globs), in two generations (see select_rules): bounded by bytes.
    cdef dict match_cache         # the current generation
    cdef dict match_cache_old     # the previous one: hits move back into the current
    cdef size_t cache_bytes       # estimated bytes of the current generation
    cdef size_t cache_old_bytes
    cdef size_t cache_limit       # both generations together; 0 = no cache
    cdef readonly uint64_t cache_hits
    cdef readonly uint64_t cache_misses
    cdef object matcher
    cdef readonly object recent_denials   # deque of (time_ms, num, key, cost)
    cdef readonly uint64_t denials_total  # denials and shadow denials, ever
    cdef size_t change_limit      # replication: change-log bytes per table, 0 = off
    cdef MemoryBound bound        # maxmemory, or None
    cdef uint32_t order[MAX_RULES_PER_CHECK]
    # The number of the rule whose numbers the last evaluate() gave (0: none
    # applied), which the HTTP front names and describes in its headers.
    cdef readonly uint32_t binding_rule
    cdef CheckResult results[MAX_RULES_PER_CHECK]
    # The hot-key tracker (the server's, ServerCore.hotkeys, through
    # track_hot_keys) or NULL: evaluate() counts the bucket of each rule of
    # one check in its sample, for every caller (CL.LIMIT, CL.APPLY, the
    # HTTP endpoints, the Envoy rate limit service).
    cdef fl_hk* hot
    cdef HotKeys hot_owner
    # Split keys: the sub-bucket each selected rule checks (-1: none), the
    # client key without its sub-key suffix, the choice's random state, and
    # in cluster mode the slots served here (ServerCore.slot_served, where
    # 1 means served; NULL standalone: every sub-bucket is here).
    cdef int subs[MAX_RULES_PER_CHECK]
    cdef int split_rules          # rules in use with split > 1 (count_split)
    cdef char* basebuf
    cdef size_t basecap
    cdef uint64_t rng
    cdef const uint8_t* local_slots
    cdef readonly int refused_split   # the k of the rule FL_ESPLIT names
    # Regions: the spends of "global" rules since the last drain_spends(),
    # each <u32 rule number><u32 key length><i64 cost><the bucket key less
    # its number>, at most spend_limit bytes (a spend past it is counted in
    # spends_dropped, never blocks a check).
    cdef char* spend_log
    cdef size_t spend_len
    cdef size_t spend_cap
    cdef readonly size_t spend_limit
    cdef readonly uint64_t spends_dropped
    cdef readonly uint64_t spends_logged
    # Home rules: this region's index among the regions and their number,
    # which homes are unreachable, the rules in use that are home rules
    # (none: evaluate skips route_home), the region the last FL_EHOME or
    # FL_EHOMEDOWN names, and whether checks run here whatever their home
    # (a check another region forwarded here)
    cdef int region_index
    cdef int region_count
    cdef uint8_t home_down[MAX_REGIONS]
    cdef int home_rules
    cdef readonly int home_region
    cdef readonly bint home_fail_closed
    cdef public bint home_local
    cdef public bint home_allowing   # a home rule has a home_allowance (registry.py)
    cdef dict home_tables         # rule number -> the bytes its home_prefixes point into

    cdef int sample_buckets(self, const char* client, size_t clen, const char* resource,
                            size_t rlen, int n, int64_t now_ms) except -1

    cdef int check_rule(self, uint32_t num, int sub, const char* client, size_t clen,
                        const char* resource, size_t rlen, int64_t cost,
                        int64_t now_ms, bint commit, CheckResult* out) except? -100
    cdef void count_split(self, uint32_t num, int sign) noexcept
    cdef int choose_subs(self, const char** client, size_t* clen, int n) except? -100
    cdef int keep_base(self, const char** client, size_t* clen, int index,
                       size_t at) except -1
    cdef int pick_sub(self, uint32_t num, const char* client, size_t clen, int other)
    cdef int inherit(self, uint32_t num, int sub, const char* client, size_t clen,
                     const char* resource, size_t rlen, int64_t now_ms) except? -100
    cdef int second_choice(self, int i, const char* client, size_t clen,
                           const char* resource, size_t rlen, int64_t cost,
                           int64_t now_ms) except? -100
    cpdef str split_error(self, int rc)
    cdef int shed_policy(self, int n, bint* fail_closed) noexcept
    cdef void log_spend(self, uint32_t num, size_t keylen, int64_t cost) noexcept
    cdef int route_home(self, const char* client, size_t clen, int n) noexcept
    cdef void count_home(self, uint32_t num, int sign) noexcept
    cdef size_t raw_key(self, uint32_t num, bytes suffix) except? 0
    cdef size_t key_of(self, int i, const char* client, size_t clen, const char* resource,
                       size_t rlen) except? 0
    cdef int evaluate(self, const char* client, size_t clen, const char* resource,
                      size_t rlen, int n, int64_t cost, int64_t now_ms,
                      CheckResult* out) except? -100
    cdef int select_rules(self, const char* client, size_t clen, const char* resource,
                          size_t rlen, const char* tier, size_t tlen) except -1
    cdef int select_ids(self, list nums) except -1
    cdef size_t compose_key(self, uint32_t num, uint32_t epoch, int sub, const char* client,
                            size_t clen, const char* resource, size_t rlen) except? 0
    cdef int make_room(self, const char* client, size_t clen, const char* resource,
                       size_t rlen, int n, int64_t now_ms) except? -100
    cdef bint selected(self, uint32_t num, int n) noexcept
    cdef int64_t checked_now(self, now_ms) except? -1
    cdef int attach_lease_table(self, uint32_t num, RuleSpec* compiled) except -1
    cdef RuleSpec* concurrency_rule(self, uint32_t num) except NULL
    cdef list all_tables(self)
    cdef list named_tables(self)
    cdef list slot_tables(self)
    cdef tuple cached_match(self, object cache_key, bytes resource, object tier)
    cdef tuple compile_match(self, bytes resource, object tier)
    cdef void cache_entry(self, object cache_key, tuple entry, size_t nbytes)
    cdef int add_selected(self, uint32_t num, int n) except -1
    cdef void note_denial(self, int64_t now_ms, uint32_t num, const char* client,
                          size_t clen, int64_t cost)
    cdef int apply_one(self, uint32_t num, const char* client, size_t clen, int64_t cost,
                       int64_t now_ms, CheckResult* out) except? -100
    cdef int raise_refusal(self, int rc, int n) except -1
    cdef object run(self, bytes client, bytes resource, int n, int64_t cost, now_ms,
                    bint detail)
    cpdef list last_detail(self, int n)
    cdef int throttle_c(self, const char* key, size_t keylen, int64_t burst,
                        int64_t count, int64_t period_ms, int64_t quantity,
                        int64_t now_ms, CheckResult* out) noexcept
