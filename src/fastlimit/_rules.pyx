"""Named rules in the engine; see _rules.pxd for the contract."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t, uint32_t, uint16_t, uint8_t, INT64_MAX
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset, memcmp

from fastlimit._hotkeys cimport HotKeys, fl_hk_due, fl_hk_begin, fl_hk_count, FL_HK_RULE

from fastlimit._core cimport (Table, Probe, CheckResult, BucketParams, Clock, FL_OK,
                              fl_get_u32, fl_put_u16,
                              FL_ENOMEM, FL_EKEYLEN, FL_MAX_KEY_LEN, table_init,
                              table_free, table_clear, table_lookup, table_insert,
                              table_delete, table_count, table_memory, table_sweep,
                              probe_value, probe_record, record_live, expire_second,
                              bucket_check, bucket_params_error, fl_get_i64,
                              fl_put_i64, fl_put_u32, fl_mono_ns, fl_i128,
                              BUCKET_STORED_SIZE, MAX_NOW_MS, invariant, dump_section,
                              load_table, note_change, table_track, table_untrack,
                              drain_section, oldest_note, log_overflowed, value_check,
                              in_range, bucket_value_ok, fl_get_u16, route_key,
                              SlotKeys, SlotCursor, count_in_slot, keys_in_slot,
                              walk_slots, filter_section, whole_key, MemoryBound,
                              set_table_bound, raise_for, MemBound, bound_reclaim,
                              insert_cost, INSERT_ROUNDS, FL_EOOM, RECORD_HEADER,
                              record_spent, spent_share, bucket_table_init, bucket_tokens,
                              bucket_last, keylen_after, key_after)
from fastlimit._core import checked_slot
from fastlimit._cluster cimport key_slot

import collections
import fnmatch
import hashlib
import os
import struct

# The Python-facing names of the algorithms, by Algorithm value.
ALGORITHMS = ("token_bucket", "fixed_window", "sliding_window", "gcra", "concurrency")
# How many recent denials RuleEngine keeps for CL.RULE DENIALS.
DENIAL_SAMPLE = 128
# Rules one request is checked against at most; rules are refused when set
# if some request could match more (fastlimit.rules.registry).
MAX_RULES_PER_REQUEST = MAX_RULES_PER_CHECK
# The match cache's default size in bytes (rules-cache-size).
DEFAULT_MATCH_CACHE_BYTES = 16 * 1024 * 1024

cdef extern from "fl_native.h":
    const int64_t MAX_LIMIT "MAX_CAPACITY"      # 10**15, as for bucket capacity
    const int64_t MAX_WINDOW_MS "MAX_PERIOD_MS"  # 2**32 - 1
    const int64_t MAX_GCRA_COUNT                 # 10**6 arrivals per period
    const int64_t MAX_GCRA_BURST                 # 10**9
    const int64_t MAX_GCRA_TOLERANCE             # 10**18: period_ms * (burst + 1)

MAX_SPLIT = FL_SPLIT_MAX
MAX_RULE_NUMBER = RULE_NUMBER_MASK

cdef enum:
    MAX_LEASE_MS = 86400000                      # a day
    # Resource and tier bytes up to which a match cache key holds them as
    # they are; longer ones are keyed by a 16-byte digest.
    MAX_CACHED_KEY = 256
    # What a cache entry costs besides its bytes: the dict slot, the key,
    # entry and packed objects' headers (CPython 3.11, 64-bit), rounded up.
    CACHE_ENTRY_OVERHEAD = 320
    CONCURRENCY_SHARDS = 16                      # a rule's own table starts small

cdef uint32_t VALUE_SIZES[N_SHARED_TABLES]
VALUE_SIZES[:] = [BUCKET_STORED_SIZE, FIXED_WINDOW_VALUE, SLIDING_WINDOW_VALUE, GCRA_VALUE]


# ---- loaded values: what each algorithm's writes can store ----------------------
# (the bounds its arithmetic is proven for; see each *_check)

cdef bint fixed_window_value_ok(const char* v, uint32_t size) noexcept nogil:
    return in_range(fl_get_i64(v), 0, MAX_LIMIT) and in_range(fl_get_i64(v + 8), 0, MAX_NOW_MS)


cdef bint sliding_window_value_ok(const char* v, uint32_t size) noexcept nogil:
    return (in_range(fl_get_i64(v), 0, MAX_LIMIT) and in_range(fl_get_i64(v + 8), 0, MAX_LIMIT)
            and in_range(fl_get_i64(v + 16), 0, MAX_NOW_MS))


cdef bint gcra_value_ok(const char* v, uint32_t size) noexcept nogil:
    cdef int64_t count = fl_get_i64(v + 8)
    return in_range(count, 1, MAX_GCRA_COUNT) and in_range(
        fl_get_i64(v), 0, MAX_NOW_MS * count + MAX_GCRA_TOLERANCE)


cdef bint lease_value_ok(const char* v, uint32_t size) noexcept nogil:
    cdef uint32_t i
    for i in range(size // LEASE_SLOT):
        if not in_range(fl_get_i64(v + i * LEASE_SLOT), 0, MAX_NOW_MS + MAX_LEASE_MS):
            return False
    return True


# Eviction ranks (see _core.pxd's record_spent): how spent a record's
# limit is at now_ms, by its rule's own numbers (the record's key names the
# rule), from the value, not the expiry (a second, too coarse for a limit
# refilling in one).  A bucket of a rule that is gone (or now of another
# algorithm) is read by nothing again: spent 0, evicted first.
cdef const RuleSpec* record_rule(const char* rec, uint32_t value_size, const void* ctx,
                                 int algorithm) noexcept nogil:
    cdef const RuleRoute* ruleset = <const RuleRoute*>ctx
    cdef uint32_t num
    if keylen_after(rec, value_size) < 4:
        return NULL
    num = fl_get_u32(key_after(rec, value_size)) & RULE_NUMBER_MASK
    if num >= ruleset.nrules or not ruleset.rules[num].in_use \
            or ruleset.rules[num].algorithm != algorithm:
        return NULL
    return &ruleset.rules[num]


cdef uint64_t token_bucket_spent(const char* rec, uint32_t value_size, const void* ctx,
                                 int64_t now_ms) noexcept nogil:
    """Milli-tokens missing at now_ms (what was missing at the last write
    less the refill since, the remainder's fraction of one left out) over
    the capacity's.  elapsed * refill * 1000 <= 4e12 * 1e15 * 1e3 < 2^102."""
    cdef const RuleSpec* r = record_rule(rec, value_size, ctx, ALG_TOKEN_BUCKET)
    cdef const char* v = rec + RECORD_HEADER
    cdef int64_t cap_m, elapsed
    if r == NULL:
        return 0
    cap_m = r.bucket.capacity * 1000
    elapsed = now_ms - bucket_last(v)
    return spent_share(cap_m - bucket_tokens(v) - (
        <fl_i128>elapsed * r.bucket.refill * 1000 // r.bucket.period_ms if elapsed > 0 else 0),
        cap_m)


cdef uint64_t gcra_spent(const char* rec, uint32_t value_size, const void* ctx,
                         int64_t now_ms) noexcept nogil:
    """Time until the theoretical arrival time over the tolerance
    (period_ms * (burst + 1) / count ms), both in ticks of the stored
    count: (tat - now * c) * count / (c * period_ms * (burst + 1)), below
    2^63 * 2^20 over at most 10^6 * 10^18 (gcra_value_ok's bounds)."""
    cdef const RuleSpec* r = record_rule(rec, value_size, ctx, ALG_GCRA)
    cdef const char* v = rec + RECORD_HEADER
    cdef int64_t c = fl_get_i64(v + 8)
    if r == NULL:
        return 0
    return spent_share((fl_get_i64(v) - <fl_i128>now_ms * c) * r.count,
                       <fl_i128>c * r.period_ms * (r.burst + 1))


cdef uint64_t fixed_window_spent(const char* rec, uint32_t value_size, const void* ctx,
                                 int64_t now_ms) noexcept nogil:
    cdef const RuleSpec* r = record_rule(rec, value_size, ctx, ALG_FIXED_WINDOW)
    if r == NULL:
        return 0
    return spent_share(fl_get_i64(rec + RECORD_HEADER), r.limit)


cdef uint64_t sliding_window_spent(const char* rec, uint32_t value_size, const void* ctx,
                                   int64_t now_ms) noexcept nogil:
    """Both windows' counts over the limit: the most the sliding estimate
    can make of them."""
    cdef const RuleSpec* r = record_rule(rec, value_size, ctx, ALG_SLIDING_WINDOW)
    if r == NULL:
        return 0
    return spent_share(<fl_i128>fl_get_i64(rec + RECORD_HEADER)
                       + fl_get_i64(rec + RECORD_HEADER + 8), r.limit)


cdef uint64_t lease_spent(const char* rec, uint32_t value_size, const void* ctx,
                          int64_t now_ms) noexcept nogil:
    """Leases held at now_ms over the rule's limit (its record's slots)."""
    cdef const char* v = rec + RECORD_HEADER
    cdef int64_t held = 0
    cdef uint32_t i
    for i in range(value_size // LEASE_SLOT):
        held += fl_get_i64(v + i * LEASE_SLOT) > now_ms
    return spent_share(held, value_size // LEASE_SLOT)


cdef record_spent SPENT[N_SHARED_TABLES]
SPENT[<int>ALG_TOKEN_BUCKET] = token_bucket_spent
SPENT[<int>ALG_FIXED_WINDOW] = fixed_window_spent
SPENT[<int>ALG_SLIDING_WINDOW] = sliding_window_spent
SPENT[<int>ALG_GCRA] = gcra_spent


cdef value_check VALUE_CHECKS[N_SHARED_TABLES]
VALUE_CHECKS[<int>ALG_TOKEN_BUCKET] = bucket_value_ok
VALUE_CHECKS[<int>ALG_FIXED_WINDOW] = fixed_window_value_ok
VALUE_CHECKS[<int>ALG_SLIDING_WINDOW] = sliding_window_value_ok
VALUE_CHECKS[<int>ALG_GCRA] = gcra_value_ok


cdef bytes long_key_digest(bytes resource, object tier, const uint8_t* seed):
    """The match cache key of a long resource (and tier): a keyed digest,
    so clients cannot make two requests share an entry."""
    h = hashlib.blake2b(digest_size=16, key=(<const char*>seed)[:16])
    h.update(struct.pack("<QB", len(resource), tier is not None))
    h.update(resource)
    if tier is not None:
        h.update(tier)
    return h.digest()


cdef size_t entry_bytes(object cache_key, tuple entry):
    """Estimated bytes of a match cache entry: its key's and answer's
    bytes (globs are the matcher's objects, referenced) plus the fixed
    overhead."""
    cdef size_t n = CACHE_ENTRY_OVERHEAD + len(<bytes>entry[0])
    if entry[1] is not None:
        n += 8 * len(<tuple>entry[1])
    if type(cache_key) is bytes:
        return n + len(<bytes>cache_key)
    for part in <tuple>cache_key:
        n += len(<bytes>part) + 8
    return n


cdef inline int64_t ceil_div(fl_i128 a, fl_i128 b) noexcept nogil:
    """ceil(a / b) for b > 0 and a >= 0."""
    return <int64_t>((a + b - 1) // b)


cdef inline int store_value(Table* t, Probe* p, const char* key, size_t keylen,
                            int64_t expire_ms, const char* value, size_t n,
                            int64_t now_ms) noexcept nogil:
    """Writes a record's value and expiry, inserting it when absent (at
    now_ms, the time an eviction it makes ranks records at)."""
    cdef char* rec
    cdef int rc = FL_OK
    if p.found:
        rec = probe_record(t, p)
        fl_put_u32(rec, expire_second(expire_ms))
        memcpy(probe_value(t, p), value, n)
    else:
        rc = table_insert(t, p, key, keylen, expire_second(expire_ms), value, now_ms)
    if rc == FL_OK:
        note_change(t, p, key, keylen)
    return rc


cdef inline int drop_record(Table* t, Probe* p, const char* key, size_t keylen) noexcept nogil:
    if p.found:
        table_delete(t, p)
        note_change(t, p, key, keylen)
    return FL_OK


# ---- fixed window ------------------------------------------------------------

cdef int fixed_window_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                            int64_t cost, int64_t now_ms, bint commit,
                            CheckResult* out) noexcept nogil:
    """Counts per window of window_ms aligned to the clock's zero; a window's
    count starts over at its end (up to 2x the limit can pass across a
    boundary: that is the algorithm)."""
    cdef Probe p
    cdef int64_t W = r.window_ms, L = r.limit
    cdef int64_t start = now_ms - now_ms % W, count = 0, stored_start
    cdef char value[FIXED_WINDOW_VALUE]
    cdef char* v
    table_lookup(t, key, keylen, &p)
    if record_live(t, &p, now_ms):
        v = probe_value(t, &p)
        stored_start = fl_get_i64(v + 8)
        if stored_start >= start:       # this window, or a later one the clock left
            count = min(fl_get_i64(v), L)   # a lowered limit caps what was counted
            start = stored_start
    out.limit = L
    if cost > L:
        out.allowed = 0
        out.retry_after_ms = -1
    elif count + cost <= L:
        out.allowed = 1
        out.retry_after_ms = 0
        if commit:
            count += cost
    else:
        out.allowed = 0
        out.retry_after_ms = start + W - now_ms
    out.remaining = L - count
    out.reset_after_ms = start + W - now_ms if count > 0 else 0
    if not commit:
        return FL_OK
    if count == 0:
        return drop_record(t, &p, key, keylen)
    fl_put_i64(value, count)
    fl_put_i64(value + 8, start)
    return store_value(t, &p, key, keylen, start + W, value, FIXED_WINDOW_VALUE, now_ms)


# ---- sliding window counter ------------------------------------------------------

cdef int sliding_window_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                              int64_t cost, int64_t now_ms, bint commit,
                              CheckResult* out) noexcept nogil:
    """Estimates the count over the last window_ms as
    previous * (1 - elapsed fraction) + current, with two counters per
    key, kept exact by comparing everything multiplied by window_ms."""
    cdef Probe p
    cdef int64_t W = r.window_ms, L = r.limit
    cdef int64_t start = now_ms - now_ms % W, prev = 0, curr = 0, stored_start
    cdef int64_t elapsed, e
    cdef fl_i128 used, budget
    cdef char value[SLIDING_WINDOW_VALUE]
    cdef char* v
    table_lookup(t, key, keylen, &p)
    if record_live(t, &p, now_ms):
        v = probe_value(t, &p)
        stored_start = fl_get_i64(v + 16)
        if stored_start >= start:
            prev = fl_get_i64(v)
            curr = fl_get_i64(v + 8)
            start = stored_start
        elif stored_start == start - W:
            prev = fl_get_i64(v + 8)
    elapsed = now_ms - start if now_ms > start else 0
    used = <fl_i128>prev * (W - elapsed) + <fl_i128>curr * W
    out.limit = L
    if cost > L:
        out.allowed = 0
        out.retry_after_ms = -1
    elif used + <fl_i128>cost * W <= <fl_i128>L * W:
        out.allowed = 1
        out.retry_after_ms = 0
        if commit:
            curr += cost
            used += <fl_i128>cost * W
    else:
        out.allowed = 0
        if curr + cost <= L:
            # later in this window the previous window's share has shrunk enough
            budget = <fl_i128>(L - curr - cost) * W
            e = W - <int64_t>(budget // prev)
            out.retry_after_ms = start + e - now_ms
        else:
            # only next window, when the current count becomes the previous
            budget = <fl_i128>(L - cost) * W
            e = W - <int64_t>(budget // curr)
            out.retry_after_ms = start + W + e - now_ms
    out.remaining = <int64_t>((<fl_i128>L * W - used) // W) if used < <fl_i128>L * W else 0
    if curr > 0:
        out.reset_after_ms = start + 2 * W - now_ms
    elif prev > 0:
        out.reset_after_ms = start + W - now_ms
    else:
        out.reset_after_ms = 0
    invariant(out.retry_after_ms >= -1 and out.reset_after_ms >= 0)
    if not commit:
        return FL_OK
    if prev == 0 and curr == 0:
        return drop_record(t, &p, key, keylen)
    fl_put_i64(value, prev)
    fl_put_i64(value + 8, curr)
    fl_put_i64(value + 16, start)
    return store_value(t, &p, key, keylen, start + 2 * W, value, SLIDING_WINDOW_VALUE,
                       now_ms)


# ---- GCRA ---------------------------------------------------------------------

cdef int gcra_check(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                    int64_t cost, int64_t now_ms, bint commit,
                    CheckResult* out) noexcept nogil:
    """The generic cell rate algorithm as redis-cell runs it, in exact
    integer time: a tick is 1/count ms, so the emission interval
    (period/count) is period_ms ticks.  As in redis-cell only an allowed
    request writes, and a peek (COST 0) never does.

    Bounds, so that every value is exact (fl_native.h; i128 where marked):
      now_t = now_ms * count <= 4e12 * 1e6 = 4e18 ticks
      dvt = period_ms * (burst + 1) <= 1e18 ticks (MAX_GCRA_TOLERANCE)
      inc = period_ms * cost <= 4.3e9 * 1e15 < 4.3e24 (i128)
      a stored tat <= now_t + dvt <= 5e18 < 2^63: only an allowed request
        writes, and allowed means new_tat <= now_t + dvt (diff >= 0); a
        loaded one is range-checked to the same bound (gcra_value_ok);
      rescaled to another count (stored c, new c'): tat * c' <= 5e24
        (i128), and in ms it stays tat / c <= 4e12 + 1e18;
      so in ms: ttl <= 4e12 + 1e18, retry <= that + inc / count <= that +
        dvt (retry is -1 when inc > dvt), reset <= ttl: all < 2.1e18, i64,
        and expiry now_ms + reset likewise (expire_second saturates)."""
    cdef Probe p
    cdef fl_i128 T = r.period_ms, now_t = <fl_i128>now_ms * r.count
    cdef fl_i128 dvt = T * (r.burst + 1), inc = T * cost
    cdef fl_i128 tat = now_t, new_tat, diff, ttl, nxt
    cdef char value[GCRA_VALUE]
    cdef int64_t stored_count
    table_lookup(t, key, keylen, &p)
    if record_live(t, &p, now_ms):
        tat = fl_get_i64(probe_value(t, &p))
        stored_count = fl_get_i64(probe_value(t, &p) + 8)
        if stored_count != r.count:
            # the same instant in the new ticks, rounded up: never earlier
            tat = (tat * r.count + stored_count - 1) // stored_count
    new_tat = (tat if tat > now_t else now_t) + inc
    diff = now_t - (new_tat - dvt)
    out.limit = r.burst + 1
    out.allowed = diff >= 0
    if out.allowed:
        out.retry_after_ms = 0
        if commit and cost > 0:
            tat = new_tat
    else:
        out.retry_after_ms = ceil_div(-diff, r.count) if inc <= dvt else -1
    ttl = tat - now_t if tat > now_t else 0
    nxt = dvt - ttl
    # redis-cell: remaining = (dvt - ttl) / emission interval, truncated
    out.remaining = <int64_t>(nxt // T) if nxt > 0 else 0
    out.reset_after_ms = ceil_div(ttl, r.count)
    if not commit:
        return FL_OK
    if ttl <= 0:
        # nothing owed under any count: as no record (redis-cell's key has
        # expired by then), so a clock that steps back finds none either
        return drop_record(t, &p, key, keylen)
    if not out.allowed or cost == 0:
        return FL_OK
    invariant(tat <= now_t + dvt)
    fl_put_i64(value, <int64_t>tat)
    fl_put_i64(value + 8, r.count)
    return store_value(t, &p, key, keylen, now_ms + out.reset_after_ms, value, GCRA_VALUE,
                       now_ms)


# ---- concurrency -----------------------------------------------------------------

cdef inline char* lease_slot(char* value, int64_t i) noexcept nogil:
    return value + i * LEASE_SLOT


cdef int concurrency_acquire(Table* t, const char* key, size_t keylen, RuleSpec* r,
                             int64_t now_ms, CheckResult* out) noexcept nogil:
    """Takes a free lease slot for the key.  A slot is free when it was
    released or its lease ran out, so a caller that crashes holding one
    costs capacity for lease_ms at most.  The lease id carries the slot
    and the rule's lease generation, so a stale or repeated release frees
    nothing, even after the key's record expired and came back."""
    cdef Probe p
    cdef char value[MAX_CONCURRENCY * LEASE_SLOT]
    cdef int64_t i, free_slot = -1, busy = 0, soonest = 0, latest = 0, expiry
    cdef uint32_t generation
    cdef size_t n = r.limit * LEASE_SLOT
    table_lookup(t, key, keylen, &p)
    if record_live(t, &p, now_ms):
        memcpy(value, probe_value(t, &p), n)
    else:
        memset(value, 0, n)
    for i in range(r.limit):
        expiry = fl_get_i64(lease_slot(value, i))
        if expiry > now_ms:
            busy += 1
            soonest = expiry if soonest == 0 or expiry < soonest else soonest
            latest = expiry if expiry > latest else latest
        elif free_slot < 0:
            free_slot = i
    out.limit = r.limit
    if free_slot < 0:
        out.allowed = 0
        out.remaining = 0
        out.retry_after_ms = soonest - now_ms
        out.reset_after_ms = -1
        return FL_OK
    r.lease_generation += 1
    generation = r.lease_generation
    fl_put_i64(lease_slot(value, free_slot), now_ms + r.lease_ms)
    fl_put_u32(lease_slot(value, free_slot) + 8, generation)
    out.allowed = 1
    out.remaining = r.limit - busy - 1
    out.retry_after_ms = 0
    out.reset_after_ms = (<int64_t>generation << 16) | free_slot   # the lease id
    latest = now_ms + r.lease_ms if now_ms + r.lease_ms > latest else latest
    return store_value(t, &p, key, keylen, latest, value, n, now_ms)


cdef int concurrency_release(Table* t, const char* key, size_t keylen, const RuleSpec* r,
                             int64_t lease_id, int64_t now_ms) noexcept nogil:
    cdef Probe p
    cdef int64_t slot = lease_id & 0xFFFF
    cdef char* v
    cdef char* s
    if lease_id >> 48 != 0 or slot >= r.limit:
        return 0        # ids are <u32 generation><u16 slot>: nothing above bit 48
    table_lookup(t, key, keylen, &p)
    if not record_live(t, &p, now_ms):
        return 0
    v = probe_value(t, &p)
    s = lease_slot(v, slot)
    if fl_get_u32(s + 8) != <uint32_t>(lease_id >> 16) or fl_get_i64(s) <= now_ms:
        return 0
    fl_put_i64(s, 0)
    note_change(t, &p, key, keylen)
    return 1


# ---- rule specs ------------------------------------------------------------------

cdef int64_t spec_int(dict spec, str field, int64_t low, int64_t high) except? -1:
    value = spec.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{field}: must be an integer from {low} to {high}")
    return value


# A home rule's key-prefix table (README "Home rules"): its entries and
# their longest prefix.
MAX_HOME_PREFIXES = 64
MAX_HOME_PREFIX_LEN = 256

# Spends of global rules kept between two drains (RuleEngine.log_spend):
# 8 MB, some 250,000 checks of 16-byte keys, far more than one node
# checks in a region-sync-ms.
DEFAULT_SPEND_LOG_BYTES = 8 << 20


cdef int compile_spec(RuleSpec* r, dict spec) except -1:
    """Fills r from a rule's spec dict (see RuleEngine.define)."""
    cdef const char* err
    algorithm = spec.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: must be one of {', '.join(ALGORITHMS)}")
    r.algorithm = ALGORITHMS.index(algorithm)
    r.shadow = bool(spec.get("shadow", False))
    scope = spec.get("scope", "client")
    if scope not in ("client", "client+resource"):
        raise ValueError("scope: must be 'client' or 'client+resource'")
    r.per_resource = scope == "client+resource"
    if r.algorithm == ALG_TOKEN_BUCKET:
        r.bucket.capacity = spec_int(spec, "capacity", 1, MAX_LIMIT)
        r.bucket.refill = spec_int(spec, "refill", 1, MAX_LIMIT)
        r.bucket.period_ms = spec_int(spec, "period_ms", 1, MAX_WINDOW_MS) \
            if "period_ms" in spec else 1000
        r.bucket.cost = 0
        err = bucket_params_error(&r.bucket)
        if err != NULL:
            raise ValueError(err.decode())
    elif r.algorithm == ALG_CONCURRENCY:
        r.limit = spec_int(spec, "limit", 1, MAX_CONCURRENCY)
        r.lease_ms = spec_int(spec, "lease_ms", 1, MAX_LEASE_MS)
    elif r.algorithm == ALG_GCRA:
        r.burst = spec_int(spec, "burst", 0, MAX_GCRA_BURST)
        r.count = spec_int(spec, "count", 1, MAX_GCRA_COUNT)
        r.period_ms = spec_int(spec, "period_ms", 1, MAX_WINDOW_MS)
        if <fl_i128>r.period_ms * (r.burst + 1) > MAX_GCRA_TOLERANCE:
            raise ValueError("period_ms: period_ms * (burst + 1) must be at most 10^18")
    else:
        r.limit = spec_int(spec, "limit", 1, MAX_LIMIT)
        r.window_ms = spec_int(spec, "window_ms", 1, MAX_WINDOW_MS)
    compile_split(r, spec)
    r.priority = spec_int(spec, "priority", 0, 2) if spec.get("priority") is not None else -1
    r.fail_closed = spec.get("on_failure", "open") == "closed"
    r.region_sync = bool(spec.get("region_sync", False))
    if r.region_sync and (r.algorithm == ALG_CONCURRENCY or r.split > 1):
        raise ValueError("regions: a global rule cannot be a concurrency rule or split "
                         "(its spends are counted per whole bucket)")
    r.home = spec_int(spec, "home", HOME_BY_KEY, MAX_REGIONS - 1) if "home" in spec \
        else HOME_NONE
    if r.home != HOME_NONE and (r.algorithm == ALG_CONCURRENCY or r.split > 1):
        raise ValueError("regions: a home rule cannot be a concurrency rule or split")
    return 0


class HomeElsewhere(ValueError):
    """A home rule's key lives in region `home` (an index of the regions),
    which answers the check; `down`: that region is unreachable now;
    `fail_closed`: whether the check's rules deny when it cannot be
    answered (on_failure); `rules`: the numbers of the rules checked."""

    def __init__(self, int home, bint down, bint fail_closed, list rules=None):
        super().__init__(f"the check's home region ({home}) is "
                         + ("unreachable" if down else "another region"))
        self.home = home
        self.down = down
        self.fail_closed = fail_closed
        self.rules = rules or []      # the check's rule numbers (home_allowance)


cpdef int home_index(bytes key, int regions) except -1:
    """The index of the region a key of a home rule without a home lives
    in: FNV-1a (64 bits) of the key, modulo the number of regions, the same
    in every region and every version."""
    if regions < 1:
        raise ValueError("no regions")
    return <int>(fnv1a64(PyBytes_AS_STRING(key), len(key)) % <uint64_t>regions)


cdef bytes home_table(prefixes):
    """A rule's home_prefixes, [(prefix bytes, region index), ...], as the
    bytes route_home reads, the longest prefix first."""
    if not prefixes:
        return b""
    if len(prefixes) > MAX_HOME_PREFIXES:
        raise ValueError(f"home_prefixes: at most {MAX_HOME_PREFIXES}")
    parts = []
    for prefix, region in sorted(prefixes, key=lambda entry: -len(entry[0])):
        if not isinstance(prefix, bytes) or not 1 <= len(prefix) <= MAX_HOME_PREFIX_LEN \
                or not 0 <= region < MAX_REGIONS:
            raise ValueError(f"home_prefixes: each a prefix of 1 to {MAX_HOME_PREFIX_LEN} "
                             "bytes and a region")
        parts.append(bytes((region,)) + len(prefix).to_bytes(2, "little") + prefix)
    return b"".join(parts)


cdef inline int prefix_home(const RuleSpec* r, const char* client, size_t clen) noexcept nogil:
    """The region of the first of r's home_prefixes client starts with; -1
    if none."""
    cdef size_t pos = 0, n
    while pos + 3 <= r.home_prefixes_len:
        n = fl_get_u16(r.home_prefixes + pos + 1)
        if n <= clen and memcmp(client, r.home_prefixes + pos + 3, n) == 0:
            return <uint8_t>r.home_prefixes[pos]
        pos += 3 + n
    return -1


cdef uint64_t fnv1a64(const char* p, size_t n) noexcept nogil:
    cdef uint64_t h = 14695981039346656037ULL
    cdef size_t i
    for i in range(n):
        h = (h ^ <uint8_t>p[i]) * 1099511628211ULL
    return h


cdef int compile_split(RuleSpec* r, dict spec) except -1:
    """A split rule's k (1 to FL_SPLIT_MAX), epoch (0 to 255) and earlier
    splits ("split_history": [[epoch, k], ...], newest first): each
    sub-bucket must hold at least one token and refill slow enough to stay
    in range."""
    cdef int i
    r.split = spec_int(spec, "split", 1, FL_SPLIT_MAX) if "split" in spec else 1
    r.split_epoch = spec_int(spec, "split_epoch", 0, 255) if "split_epoch" in spec else 0
    history = spec.get("split_history", ())
    if not isinstance(history, (list, tuple)) or len(history) > SPLIT_HISTORY:
        raise ValueError(f"split_history: at most {SPLIT_HISTORY} [epoch, k] pairs")
    r.nprev = 0
    for i, entry in enumerate(history):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError("split_history: each entry is [epoch, k]")
        pair = {"epoch": entry[0], "k": entry[1]}
        r.prev_epoch[i] = spec_int(pair, "epoch", 0, 255)
        r.prev_split[i] = spec_int(pair, "k", 1, FL_SPLIT_MAX)
        r.nprev = i + 1
    if r.split == 1:
        return 0
    if r.algorithm == ALG_CONCURRENCY:
        raise ValueError("split: a concurrency rule cannot be split")
    if split_total(r) < r.split:
        raise ValueError("split: more sub-buckets than the limit has tokens")
    if r.algorithm in (ALG_TOKEN_BUCKET, ALG_GCRA) and \
            (r.bucket.period_ms if r.algorithm == ALG_TOKEN_BUCKET else r.period_ms) \
            * r.split > MAX_WINDOW_MS:
        raise ValueError(f"split: period_ms * split must be at most {MAX_WINDOW_MS}")
    return 0


cdef inline int64_t split_total(const RuleSpec* r) noexcept nogil:
    """What a rule's split divides: the bucket's capacity, the window's
    limit, a GCRA's burst + 1."""
    if r.algorithm == ALG_TOKEN_BUCKET:
        return r.bucket.capacity
    if r.algorithm == ALG_GCRA:
        return r.burst + 1
    return r.limit


cdef void sub_spec(const RuleSpec* r, int k, int i, RuleSpec* out) noexcept nogil:
    """Sub-bucket i of r split k ways: its share of the tokens and 1/k
    of the rate (the period k times longer)."""
    out[0] = r[0]
    if k <= 1:
        return
    if r.algorithm == ALG_TOKEN_BUCKET:
        out.bucket.capacity = fl_split_share(r.bucket.capacity, k, i)
        out.bucket.period_ms = r.bucket.period_ms * k
    elif r.algorithm == ALG_GCRA:
        out.burst = fl_split_share(r.burst + 1, k, i) - 1
        out.period_ms = r.period_ms * k
    else:
        out.limit = fl_split_share(r.limit, k, i)


cdef inline int algorithm_step(Table* tables, const RuleSpec* r, const char* key,
                               size_t keylen, int64_t cost, int64_t now_ms, bint commit,
                               CheckResult* out) noexcept nogil:
    """The rule's algorithm's step on the bucket under key (inline: it is
    the check path)."""
    cdef BucketParams bp
    if r.algorithm == ALG_TOKEN_BUCKET:
        bp = r.bucket
        bp.cost = cost
        if cost > MAX_LIMIT:
            bp.cost = bp.capacity + 1   # can never pass; keeps the maths in range
        return bucket_check(&tables[r.algorithm], key, keylen, 0, &bp, now_ms, commit, out)
    if r.algorithm == ALG_FIXED_WINDOW:
        return fixed_window_check(&tables[r.algorithm], key, keylen, r, cost, now_ms, commit,
                                  out)
    if r.algorithm == ALG_SLIDING_WINDOW:
        return sliding_window_check(&tables[r.algorithm], key, keylen, r, cost, now_ms,
                                    commit, out)
    return gcra_check(&tables[r.algorithm], key, keylen, r, cost, now_ms, commit, out)


cdef int split_pick(uint64_t* rng, const unsigned char* local_slots, const char* base,
                    size_t n, int k, int other, char* scratch) noexcept:
    """A random sub-bucket of base split k ways, other than `other` (-1:
    any), among those served here (local_slots: a slot's SLOT_SERVED is 1;
    NULL, standalone, serves all); -1 when there is none.  scratch holds
    n + FL_SPLIT_SUFFIX_MAX bytes."""
    cdef int j, count = 0
    cdef int here[FL_SPLIT_MAX]
    if local_slots == NULL:
        if k - (other >= 0) <= 0:
            return -1
        j = <int>(fl_split_random(rng) % <uint64_t>(k - (other >= 0)))
        return j + (other >= 0 and j >= other)
    for j in range(k):
        if j != other and local_slots[key_slot(scratch,
                                               fl_split_subkey(base, n, j, scratch))] == 1:
            here[count] = j
            count += 1
    if count == 0:
        return -1
    return here[fl_split_random(rng) % <uint64_t>count]


cpdef str split_refused(int k):
    """Why a plain key of a split bucket is refused in cluster mode: its k
    sub-buckets are on several shards, so the client picks one.  The
    reply starts with SPLIT k so a client can read k from it."""
    return (f"SPLIT {k} the key is split into {k} sub-keys on several shards: check one "
            f"of them, the key with #0 to #{k - 1} at the end of its hashed part")


# ---- cluster slots ---------------------------------------------------------------

cdef int rule_client_key(const char* key, size_t keylen, const void* ctx,
                         const char** out, size_t* outlen) noexcept nogil:
    """The client key inside a rule bucket's key (see compose_key): after
    the rule number, and for a per-resource rule after the u16 length that
    ends it.  The rule says which form, so a client key holding any byte
    (NUL included) is found exactly.  -1 for a rule that is gone."""
    cdef const RuleRoute* route = <const RuleRoute*>ctx
    cdef uint32_t num
    cdef size_t clen
    if keylen < 4:
        return -1
    num = fl_get_u32(key) & RULE_NUMBER_MASK
    if num >= route.nrules or not route.rules[num].in_use:
        return -1
    if not route.rules[num].per_resource:
        out[0] = key + 4
        outlen[0] = keylen - 4
        return 0
    if keylen < 6:
        return -1
    clen = fl_get_u16(key + 4)
    if 6 + clen > keylen:
        return -1
    out[0] = key + 6
    outlen[0] = clen
    return 0


cdef class RuleEngine:
    """The buckets of named rules, one table per algorithm, and the
    all-or-nothing evaluation of every rule matching a request."""

    def __cinit__(self, Clock clock=None, uint32_t shards=256, bytes seed=None):
        cdef int i
        if shards == 0 or shards & (shards - 1) or shards > 65536:
            raise ValueError("shards must be a power of two from 1 to 65536")
        seed = seed if seed is not None else os.urandom(16)
        memcpy(self.seed, <const char*>seed, 16)
        self.rng = int.from_bytes(os.urandom(8), "little") | 1
        self.local_slots = NULL
        self.split_rules = 0
        memset(self.subs, 0xFF, sizeof(self.subs))     # every int -1: nothing split
        self.basebuf = NULL
        self.basecap = 0
        self.clock = clock if clock is not None else Clock()
        for i in range(N_SHARED_TABLES):
            if (bucket_table_init(&self.tables[i], shards, <const uint8_t*><const char*>seed)
                    if i == ALG_TOKEN_BUCKET else
                    table_init(&self.tables[i], shards, VALUE_SIZES[i],
                               <const uint8_t*><const char*>seed)) != FL_OK:
                raise MemoryError()
        if table_init(&self.throttle_table, shards, GCRA_VALUE,
                      <const uint8_t*><const char*>seed) != FL_OK:
            raise MemoryError()
        self.rules = NULL
        self.wholes = NULL
        self.nrules = 0
        self.ruleset = RuleRoute(NULL, 0)
        for i in range(N_SHARED_TABLES):
            self.tables[i].spent = SPENT[i]
            self.tables[i].spent_ctx = &self.ruleset
        self.keybuf = <char*>malloc(256)
        self.keycap = 256 if self.keybuf != NULL else 0
        self.match_cache = {}
        self.match_cache_old = {}
        self.cache_limit = DEFAULT_MATCH_CACHE_BYTES
        self.matcher = None
        self.recent_denials = collections.deque(maxlen=DENIAL_SAMPLE)
        self.spend_log = NULL
        self.spend_len = self.spend_cap = 0
        self.region_index, self.region_count = 0, 1
        memset(self.home_down, 0, sizeof(self.home_down))
        self.home_rules = 0
        self.home_region = -1
        self.home_local = False
        self.home_allowing = False
        self.home_tables = {}
        self.spend_limit = DEFAULT_SPEND_LOG_BYTES

    def __dealloc__(self):
        cdef uint32_t i
        for i in range(N_SHARED_TABLES):
            table_free(&self.tables[i])
        table_free(&self.throttle_table)
        for i in range(self.nrules):
            release_lease_table(&self.rules[i])
        free(self.rules)
        free(self.wholes)
        free(self.keybuf)
        free(self.basebuf)
        free(self.spend_log)

    # ---- rules ----------------------------------------------------------------

    def define(self, uint32_t num, dict spec):
        """Creates or updates rule `num` from spec: "algorithm" (token_bucket,
        fixed_window, sliding_window, gcra), "shadow", "scope" ("client" or
        "client+resource") and the algorithm's numbers (token_bucket:
        capacity, refill, period_ms; windows: limit, window_ms; gcra: burst,
        count, period_ms).  Updating keeps the rule's buckets."""
        cdef RuleSpec compiled, whole
        cdef RuleSpec* grown
        cdef uint32_t cap
        cdef bytes table
        memset(&compiled, 0, sizeof(RuleSpec))
        if num > RULE_NUMBER_MASK:
            raise ValueError(f"rule number {num} is past {RULE_NUMBER_MASK}")
        compile_spec(&compiled, spec)
        table = home_table(spec.get("home_prefixes", ()))
        whole = compiled
        if "whole" in spec:      # a global rule under its partition share (debit())
            memset(&whole, 0, sizeof(RuleSpec))
            compile_spec(&whole, spec["whole"])
        if num >= self.nrules:
            cap = max(num + 1, self.nrules * 2, 16)
            grown = <RuleSpec*>realloc(self.wholes, cap * sizeof(RuleSpec))
            if grown == NULL:
                raise MemoryError()
            self.wholes = grown
            grown = <RuleSpec*>realloc(self.rules, cap * sizeof(RuleSpec))
            if grown == NULL:
                raise MemoryError()
            memset(grown + self.nrules, 0, (cap - self.nrules) * sizeof(RuleSpec))
            self.rules = grown
            self.nrules = cap
            self.ruleset = RuleRoute(grown, cap)
        elif self.rules[num].in_use and self.rules[num].algorithm == compiled.algorithm:
            compiled.allowed = self.rules[num].allowed
            compiled.denied = self.rules[num].denied
            compiled.shadow_denied = self.rules[num].shadow_denied
        if compiled.algorithm == ALG_CONCURRENCY:
            compiled.lease_generation = self.rules[num].lease_generation
            self.attach_lease_table(num, &compiled)
        else:
            release_lease_table(&self.rules[num])
        compiled.home_prefixes = PyBytes_AS_STRING(table) if table else NULL
        compiled.home_prefixes_len = len(table)
        compiled.in_use = True
        self.count_split(num, -1)
        self.count_home(num, -1)
        self.rules[num] = compiled
        if table:
            self.home_tables[num] = table      # what home_prefixes points into
        else:
            self.home_tables.pop(num, None)
        self.wholes[num] = whole
        self.count_split(num, 1)
        self.count_home(num, 1)

    cdef int attach_lease_table(self, uint32_t num, RuleSpec* compiled) except -1:
        """A concurrency rule's records hold `limit` slots, so the rule has
        a table of its own; it is kept while the limit stays the same (a
        new limit starts its leases afresh)."""
        cdef RuleSpec* old = &self.rules[num]
        if old.leases != NULL and old.algorithm == ALG_CONCURRENCY and old.limit == compiled.limit:
            compiled.leases = old.leases
            old.leases = NULL
            return 0
        release_lease_table(old)
        compiled.leases = <Table*>malloc(sizeof(Table))
        if compiled.leases == NULL or table_init(
                compiled.leases, CONCURRENCY_SHARDS, compiled.limit * LEASE_SLOT,
                self.seed) != FL_OK:
            free(compiled.leases)
            compiled.leases = NULL
            raise MemoryError()
        if self.change_limit and table_track(compiled.leases, self.change_limit) != FL_OK:
            release_lease_table(compiled)
            raise MemoryError()
        compiled.leases.spent = lease_spent
        set_table_bound(compiled.leases, self.bound)
        return 0

    def set_bound(self, MemoryBound bound):
        """Puts every table under a memory bound, or none (None); tables
        made later (a new concurrency rule's) join it too."""
        self.bound = bound
        for t in self.all_tables():
            set_table_bound(<Table*><size_t>t, bound)

    def forget(self, uint32_t num):
        """Retires rule `num`: its buckets can never be read again (numbers
        are not reused) and the sweep reclaims them as they expire; a
        concurrency rule's own table goes at once."""
        if num < self.nrules:
            self.count_split(num, -1)
            self.count_home(num, -1)
            self.rules[num].in_use = False
            release_lease_table(&self.rules[num])

    cdef void count_split(self, uint32_t num, int sign) noexcept:
        """Keeps split_rules, the rules in use that are split; without one
        evaluate skips choose_subs, so subs must then all be -1."""
        if self.rules[num].in_use and self.rules[num].split > 1:
            self.split_rules += sign
            if self.split_rules == 0:
                memset(self.subs, 0xFF, sizeof(self.subs))     # every int -1

    def set_matcher(self, matcher):
        """matcher(resource: bytes, tier: bytes | None) -> [(num, client
        glob bytes or None), ...] for the rules whose resource and tier
        match; its answers are cached until invalidate()."""
        self.matcher = matcher
        self.invalidate()

    def invalidate(self):
        self.match_cache = {}
        self.match_cache_old = {}
        self.cache_bytes = self.cache_old_bytes = 0

    def stats(self, uint32_t num):
        if num >= self.nrules:
            return {"allowed": 0, "denied": 0, "shadow_denied": 0}
        return {"allowed": self.rules[num].allowed, "denied": self.rules[num].denied,
                "shadow_denied": self.rules[num].shadow_denied}

    def denials(self):
        return list(self.recent_denials)

    # ---- evaluation -------------------------------------------------------------

    cdef int select_rules(self, const char* client, size_t clen, const char* resource,
                          size_t rlen, const char* tier, size_t tlen) except -1:
        """Puts the numbers of the rules matching the request in
        self.order; returns how many."""
        # The key is the resource alone without a tier (the common case:
        # no tuple to build), else (resource, tier); a resource and tier
        # longer than MAX_CACHED_KEY together stand as a 1-tuple of their
        # digest, so no entry holds client bytes of any size.  Bytes and
        # tuples of different lengths never compare equal, so the three
        # kinds cannot stand for each other.
        cdef object resource_key, tier_key, cache_key
        cdef tuple entry
        cdef bytes packed
        cdef const uint32_t* nums
        cdef int n = 0, i, count
        if rlen > FL_MAX_KEY_LEN or tlen > FL_MAX_KEY_LEN:
            # Refused before matching, for every front: no bucket key could
            # hold it, and a huge one would cost its size in hashing and globs.
            raise ValueError("resource and tier must be at most 65535 bytes")
        resource_key = PyBytes_FromStringAndSize(resource, rlen)
        tier_key = None if tier == NULL else PyBytes_FromStringAndSize(tier, tlen)
        if rlen + tlen > MAX_CACHED_KEY:
            cache_key = (long_key_digest(resource_key, tier_key, self.seed),)
        else:
            cache_key = resource_key if tier == NULL else (resource_key, tier_key)
        entry = self.match_cache.get(cache_key)
        if entry is None:
            entry = self.cached_match(cache_key, resource_key, tier_key)
        else:
            self.cache_hits += 1
        packed, globs = entry
        nums = <const uint32_t*>PyBytes_AS_STRING(packed)
        count = PyBytes_GET_SIZE(packed) // sizeof(uint32_t)
        for i in range(count):
            if globs is not None and globs[i] is not None and not fnmatch.fnmatchcase(
                    PyBytes_FromStringAndSize(client, clen), globs[i]):
                continue
            n = self.add_selected(nums[i], n)
        return n

    cdef tuple cached_match(self, object cache_key, bytes resource, object tier):
        """A miss of the current generation: the previous generation's
        entry moves back into it, else the matcher answers.  Two
        generations of at most half the limit each: a generation that is
        full becomes the previous one and the one before is dropped, so
        entries in use stay and the bytes never pass the limit."""
        cdef tuple entry = self.match_cache_old.pop(cache_key, None)
        if entry is None:
            self.cache_misses += 1
            entry = self.compile_match(resource, tier)
        else:
            self.cache_hits += 1
        self.cache_entry(cache_key, entry, entry_bytes(cache_key, entry))
        return entry

    cdef void cache_entry(self, object cache_key, tuple entry, size_t nbytes):
        if nbytes > self.cache_limit // 2:
            return     # caching is off (limit 0), or the limit is tiny
        if self.cache_bytes + nbytes > self.cache_limit // 2:
            self.match_cache_old = self.match_cache
            self.cache_old_bytes = self.cache_bytes
            self.match_cache = {}
            self.cache_bytes = 0
        self.match_cache[cache_key] = entry
        self.cache_bytes += nbytes

    def set_match_cache_limit(self, size_t nbytes):
        """The most bytes the match cache may hold (rules-cache-size); 0
        turns it off.  Emptied when lowered."""
        if nbytes < self.cache_limit:
            self.invalidate()
        self.cache_limit = nbytes

    @property
    def match_cache_info(self):
        """(entries, estimated bytes, hits, misses) of the match cache."""
        return (len(self.match_cache) + len(self.match_cache_old),
                self.cache_bytes + self.cache_old_bytes, self.cache_hits, self.cache_misses)

    cdef int add_selected(self, uint32_t num, int n) except -1:
        """Appends rule num to self.order if it takes part; returns the count."""
        if num >= self.nrules or not self.rules[num].in_use:
            return n
        if self.rules[num].algorithm == ALG_CONCURRENCY:
            return n     # leases are taken and given back explicitly (CL.ACQUIRE)
        if self.selected(num, n):
            return n     # a rule named twice is checked, and spent, once
        if n == MAX_RULES_PER_CHECK:
            raise ValueError(f"more than {MAX_RULES_PER_CHECK} rules match the request")
        self.order[n] = num
        return n + 1

    cdef tuple compile_match(self, bytes resource, object tier):
        """Asks the matcher about (resource, tier): (packed u32 rule
        numbers, client globs or None when there are none)."""
        cdef list found = []
        if self.matcher is not None:
            for num, glob in self.matcher(resource, tier):
                if num < self.nrules and self.rules[<uint32_t>num].in_use:
                    found.append((num, glob))
        globs = tuple(glob for _, glob in found)
        return (struct.pack(f"={len(found)}I", *[num for num, _ in found]),
                globs if any(g is not None for g in globs) else None)

    cdef int select_ids(self, list nums) except -1:
        cdef int n = 0
        for num in nums:
            if num >= self.nrules or not self.rules[<uint32_t>num].in_use:
                raise KeyError(num)
            if self.rules[<uint32_t>num].algorithm == ALG_CONCURRENCY:
                raise ValueError("a concurrency rule is used with CL.ACQUIRE and CL.RELEASE")
            n = self.add_selected(num, n)
        return n

    cdef int check_rule(self, uint32_t num, int sub, const char* client, size_t clen,
                        const char* resource, size_t rlen, int64_t cost,
                        int64_t now_ms, bint commit, CheckResult* out) except? -100:
        """One rule's step on its bucket for this client (and resource):
        sub-bucket `sub` of a split rule (client is then the base key),
        whose limit and remaining are shown for the whole key (remaining
        as k times the sub-bucket's: an estimate)."""
        cdef RuleSpec* r = &self.rules[num]
        cdef RuleSpec part
        cdef size_t keylen = self.compose_key(num, r.split_epoch, sub, client, clen,
                                              resource, rlen)
        cdef int rc
        if keylen > FL_MAX_KEY_LEN:
            return FL_EKEYLEN
        if sub < 0:
            return algorithm_step(self.tables, r, self.keybuf, keylen, cost, now_ms, commit,
                                  out)
        sub_spec(r, r.split, sub, &part)
        rc = algorithm_step(self.tables, &part, self.keybuf, keylen, cost, now_ms, commit, out)
        out.limit = split_total(r)
        out.remaining = min(out.remaining * r.split, out.limit)
        return rc

    # ---- split keys (fl_split.h) --------------------------------------------------

    cdef int choose_subs(self, const char** client, size_t* clen, int n) except? -100:
        """The sub-bucket each of the n selected rules checks (self.subs).
        A client key that is a sub-key ("user:42#3") names its sub-bucket
        and is made its base key ("user:42", in self.basebuf); a plain one,
        or one past the rule's k (a client still on a larger split), gets a
        random sub-bucket, or, in cluster mode, is refused (its sub-buckets
        live on several shards: the client names one).  Without a split
        rule among them the key is as given."""
        cdef int i, index = -1, any_split = 0
        cdef size_t at, cut
        cdef RuleSpec* r
        for i in range(n):
            self.subs[i] = -1
            any_split |= self.rules[self.order[i]].split > 1
        if not any_split:
            return FL_OK
        if fl_split_parse(client[0], clen[0], FL_SPLIT_MAX, &index, &at):
            self.keep_base(client, clen, index, at)
        for i in range(n):
            r = &self.rules[self.order[i]]
            if r.split <= 1:
                if self.local_slots != NULL:
                    return FL_ESPLITMIX     # its bucket would be on every shard of a sub-key
            elif 0 <= index < r.split:
                self.subs[i] = index
            elif self.local_slots != NULL:
                self.refused_split = r.split
                return FL_ESPLIT
            else:
                self.subs[i] = self.pick_sub(self.order[i], client[0], clen[0], -1)
        return FL_OK

    cdef int keep_base(self, const char** client, size_t* clen, int index,
                       size_t at) except -1:
        """The base key of the sub-key client[0][:clen] (fl_split_parse's
        index and at), in self.basebuf, becomes the request's client key."""
        cdef char* grown
        if clen[0] > self.basecap:
            grown = <char*>realloc(self.basebuf, clen[0])
            if grown == NULL:
                raise MemoryError()
            self.basebuf, self.basecap = grown, clen[0]
        clen[0] = fl_split_base(client[0], clen[0], index, at, self.basebuf)
        client[0] = self.basebuf
        return 0

    cdef int pick_sub(self, uint32_t num, const char* client, size_t clen, int other):
        """A random sub-bucket of rule num other than `other` that lives
        here (split_pick); -1 when there is none."""
        cdef char* grown
        cdef size_t n = clen + FL_SPLIT_SUFFIX_MAX
        if n > self.keycap:
            grown = <char*>realloc(self.keybuf, n)
            if grown == NULL:
                return -1
            self.keybuf, self.keycap = grown, n
        return split_pick(&self.rng, self.local_slots, client, clen, self.rules[num].split,
                          other, self.keybuf)

    cdef int second_choice(self, int i, const char* client, size_t clen,
                           const char* resource, size_t rlen, int64_t cost,
                           int64_t now_ms) except? -100:
        """Two choices: a split rule's sub-bucket denied, so one other one
        (here) is tried; it replaces the first when it allows."""
        cdef uint32_t num = self.order[i]
        cdef CheckResult alt
        cdef int rc, j = self.pick_sub(num, client, clen, self.subs[i])
        if j < 0:
            return FL_OK
        rc = self.inherit(num, j, client, clen, resource, rlen, now_ms)
        if rc == FL_OK:
            rc = self.check_rule(num, j, client, clen, resource, rlen, cost, now_ms,
                                 False, &alt)
        if rc == FL_OK and alt.allowed:
            self.subs[i] = j
            self.results[i] = alt
        return rc

    cdef int inherit(self, uint32_t num, int sub, const char* client, size_t clen,
                     const char* resource, size_t rlen, int64_t now_ms) except? -100:
        """After a change of a rule's split, a bucket of the new split that
        does not exist yet starts as full as the key's buckets of the newest
        earlier split that this node holds (what they have left over what
        they hold), never fuller: changing k redistributes what is left
        and resets nothing.  Only for a check that may write."""
        cdef RuleSpec* r = &self.rules[num]
        cdef RuleSpec part
        cdef CheckResult old
        cdef Probe p
        cdef size_t keylen
        cdef fl_i128 left = 0, held = 0
        cdef int g, j, k, rc
        cdef int64_t share, keep
        if r.nprev == 0:
            return FL_OK
        keylen = self.compose_key(num, r.split_epoch, sub, client, clen, resource, rlen)
        if keylen > FL_MAX_KEY_LEN or table_lookup(&self.tables[r.algorithm], self.keybuf,
                                                   keylen, &p):
            return FL_OK
        for g in range(r.nprev):
            k = r.prev_split[g]
            for j in range(k):
                keylen = self.compose_key(num, r.prev_epoch[g], j if k > 1 else -1, client,
                                          clen, resource, rlen)
                if keylen > FL_MAX_KEY_LEN or not table_lookup(&self.tables[r.algorithm],
                                                               self.keybuf, keylen, &p):
                    continue
                sub_spec(r, k, j, &part)
                rc = algorithm_step(self.tables, &part, self.keybuf, keylen, 0, now_ms, False,
                                    &old)
                if rc != FL_OK:
                    return rc
                left += max(old.remaining, 0)
                held += old.limit
            if held > 0:
                break
        if held == 0:
            return FL_OK        # a key this node never saw: it starts full
        sub_spec(r, r.split, sub if sub >= 0 else 0, &part)
        share = split_total(&part)
        keep = <int64_t>(share * min(left, held) // held)
        if keep >= share:
            return FL_OK
        keylen = self.compose_key(num, r.split_epoch, sub, client, clen, resource, rlen)
        return algorithm_step(self.tables, &part, self.keybuf, keylen, share - keep, now_ms,
                              True, &old)

    cpdef str split_error(self, int rc):
        """The error of an evaluation that returned FL_ESPLIT or
        FL_ESPLITMIX, starting with its code word (no "ERR")."""
        if rc == FL_ESPLIT:
            return split_refused(self.refused_split)
        return ("SPLIT 0 in cluster mode a split rule cannot be checked together with a "
                "rule that is not split")

    cdef size_t key_of(self, int i, const char* client, size_t clen, const char* resource,
                       size_t rlen) except? 0:
        """compose_key for the i-th selected rule of this evaluation."""
        cdef uint32_t num = self.order[i]
        return self.compose_key(num, self.rules[num].split_epoch, self.subs[i], client,
                                clen, resource, rlen)

    cdef int make_room(self, const char* client, size_t clen, const char* resource,
                       size_t rlen, int n, int64_t now_ms) except? -100:
        """Under maxmemory, room for every bucket the commit of n rules
        would add, made at once before any is spent, so that a refused
        (or evicting) insert can neither leave the rules before it charged
        nor evict what they just wrote."""
        cdef MemBound* b = &self.bound.b
        cdef size_t need = 0, keylen
        cdef RuleSpec* r
        cdef Table* t
        cdef Probe p
        cdef int i
        for i in range(n):
            r = &self.rules[self.order[i]]
            keylen = self.key_of(i, client, clen, resource, rlen)
            t = &self.tables[r.algorithm]
            if keylen <= FL_MAX_KEY_LEN and not table_lookup(t, self.keybuf, keylen, &p):
                need += insert_cost(t, p.shard, keylen)
        if need == 0 or b.used + need <= b.limit:
            return FL_OK
        return bound_reclaim(b, need, INSERT_ROUNDS, INT64_MAX, now_ms)

    cdef bint selected(self, uint32_t num, int n) noexcept:
        cdef int i
        for i in range(n):
            if self.order[i] == num:
                return True
        return False

    cdef size_t compose_key(self, uint32_t num, uint32_t epoch, int sub, const char* client,
                            size_t clen, const char* resource, size_t rlen) except? 0:
        """Writes the rule's bucket key for the request into self.keybuf:
        <u32 rule number><client>, or <u32 rule number><u16 client
        length><client><resource> for a per-resource rule (the length keeps
        client "a" + resource "bc" apart from client "ab" + resource "c");
        for sub-bucket `sub` of a split the client is its sub-key and the
        number's high byte the split's epoch.  Returns its length."""
        cdef bint per_resource = self.rules[num].per_resource
        cdef size_t sublen = clen + (FL_SPLIT_SUFFIX_MAX if sub >= 0 else 0)
        cdef size_t keylen = 4 + sublen + (2 + rlen if per_resource else 0)
        cdef size_t at = 6 if per_resource else 4
        cdef char* grown
        if keylen > self.keycap and keylen <= FL_MAX_KEY_LEN:
            grown = <char*>realloc(self.keybuf, keylen)
            if grown == NULL:
                raise MemoryError()
            self.keybuf = grown
            self.keycap = keylen
        if keylen > FL_MAX_KEY_LEN:
            return keylen     # the caller refuses it; clen may not fit a u16
        fl_put_u32(self.keybuf, num | (epoch << RULE_NUMBER_BITS))
        if sub >= 0:
            sublen = fl_split_subkey(client, clen, sub, self.keybuf + at)
        else:
            sublen = clen
            memcpy(self.keybuf + at, client, clen)
        if per_resource:
            fl_put_u16(self.keybuf + 4, <uint16_t>sublen)
            memcpy(self.keybuf + 6 + sublen, resource, rlen)
        return at + sublen + (rlen if per_resource else 0)

    cdef int shed_policy(self, int n, bint* fail_closed) noexcept:
        """For shedding the n rules in self.order: the highest priority
        they set (-1: none does), and whether one fails closed (an
        enforcing one: a shadow rule never denies)."""
        cdef int i, priority = -1
        cdef RuleSpec* r
        fail_closed[0] = False
        self.binding_rule = 0      # a shed check is bound by no rule
        for i in range(n):
            r = &self.rules[self.order[i]]
            if r.priority > priority:
                priority = r.priority
            if r.fail_closed and not r.shadow:
                fail_closed[0] = True
        return priority

    # ---- regions: home rules --------------------------------------------------------

    cdef void count_home(self, uint32_t num, int sign) noexcept:
        if self.rules[num].in_use and self.rules[num].home != HOME_NONE:
            self.home_rules += sign

    def set_region(self, int index, int count):
        """This region's index among count regions (home rules' routing)."""
        if not 0 <= index < count <= MAX_REGIONS:
            raise ValueError(f"region {index} of {count}: out of range")
        self.region_index, self.region_count = index, count

    def set_home_down(self, int index, bint down):
        """Whether region index is unreachable: its keys' checks are then
        answered here by their rules' failure policy."""
        if 0 <= index < MAX_REGIONS:
            self.home_down[index] = down

    cdef int route_home(self, const char* client, size_t clen, int n) noexcept:
        """FL_OK if every home rule among the n selected ones has this
        client's key here; else FL_EHOME (or FL_EHOMEDOWN when that region
        is unreachable) naming the first other home in home_region: the
        whole check goes there, all or nothing."""
        cdef int i, home
        cdef RuleSpec* r
        for i in range(n):
            r = &self.rules[self.order[i]]
            if r.home == HOME_NONE:
                continue
            home = prefix_home(r, client, clen) if r.home_prefixes != NULL else -1
            if home < 0:
                home = r.home if r.home >= 0 else \
                    <int>(fnv1a64(client, clen) % <uint64_t>self.region_count)
            if home != self.region_index:
                self.home_region = home
                self.shed_policy(n, &self.home_fail_closed)
                return FL_EHOMEDOWN if self.home_down[home] else FL_EHOME
        return FL_OK

    # ---- regions: the spends of global rules ---------------------------------------

    cdef void log_spend(self, uint32_t num, size_t keylen, int64_t cost) noexcept:
        """Logs a global rule's spend on the bucket key in self.keybuf, for
        the other regions; past spend_limit (or out of memory) it is
        counted in spends_dropped instead, so a check never waits on it."""
        cdef size_t need = 16 + keylen - 4
        cdef size_t cap
        cdef char* grown
        cdef char* p
        if self.spend_len + need > self.spend_cap:
            if self.spend_len + need > self.spend_limit:
                self.spends_dropped += 1
                return
            cap = min(max(self.spend_cap * 2, self.spend_len + need, 4096), self.spend_limit)
            grown = <char*>realloc(self.spend_log, cap)
            if grown == NULL:
                self.spends_dropped += 1
                return
            self.spend_log, self.spend_cap = grown, cap
        p = self.spend_log + self.spend_len
        fl_put_u32(p, num)
        fl_put_u32(p + 4, <uint32_t>(keylen - 4))
        fl_put_i64(p + 8, cost)
        memcpy(p + 16, self.keybuf + 4, keylen - 4)
        self.spend_len += need
        self.spends_logged += 1

    def set_spend_limit(self, size_t nbytes):
        """The most bytes of spends kept between two drains."""
        self.spend_limit = nbytes

    def drain_spends(self):
        """The spends logged since the last drain, summed per bucket:
        {(rule number, key less its number): cost}; the log starts over."""
        cdef size_t pos = 0
        cdef uint32_t n
        cdef dict out = {}
        while pos < self.spend_len:
            n = fl_get_u32(self.spend_log + pos + 4)
            entry = (fl_get_u32(self.spend_log + pos),
                     PyBytes_FromStringAndSize(self.spend_log + pos + 16, n))
            out[entry] = out.get(entry, 0) + fl_get_i64(self.spend_log + pos + 8)
            pos += 16 + n
        self.spend_len = 0
        if self.spend_cap > 4 * 4096:       # a burst's buffer is not kept for good
            free(self.spend_log)
            self.spend_log, self.spend_cap = NULL, 0
        return out

    cdef size_t raw_key(self, uint32_t num, bytes suffix) except? 0:
        """<u32 num><suffix> in self.keybuf (a bucket key as a spend log
        names it); its length."""
        cdef size_t keylen = 4 + len(suffix)
        cdef char* grown
        if keylen > FL_MAX_KEY_LEN:
            raise ValueError("key longer than the 65535 bytes a bucket key may have")
        if keylen > self.keycap:
            grown = <char*>realloc(self.keybuf, keylen)
            if grown == NULL:
                raise MemoryError()
            self.keybuf, self.keycap = grown, keylen
        # the number as compose_key writes it: a rule's split epoch stays in its
        # high byte after a split is undone
        fl_put_u32(self.keybuf, num | (self.rules[num].split_epoch << RULE_NUMBER_BITS))
        memcpy(self.keybuf + 4, PyBytes_AS_STRING(suffix), len(suffix))
        return keylen

    def debit(self, uint32_t num, bytes suffix, int64_t cost, now_ms=None):
        """Spends up to cost of global rule num's bucket under suffix (its
        key less the number): what another region spent, measured against
        the whole rule even while a partition holds this region to its
        share.  A bucket holds no debt, so what it cannot take is left out
        (the overshoot the README bounds).  Returns what it took; 0 for a rule that is not
        (or no longer) a global one.  Not counted in the rule's checks."""
        cdef CheckResult res
        cdef RuleSpec* r
        cdef int64_t now = self.checked_now(now_ms)
        cdef int64_t take
        cdef size_t keylen
        cdef int rc
        if num >= self.nrules or not self.rules[num].in_use or \
                not self.rules[num].region_sync or cost <= 0:
            return 0
        r = &self.wholes[num]    # the whole rule's numbers, whatever a partition allows here
        keylen = self.raw_key(num, suffix)
        rc = algorithm_step(self.tables, r, self.keybuf, keylen, 0, now, False, &res)
        if rc != FL_OK:
            raise_for(rc)
        take = min(cost, res.remaining)
        if take <= 0:
            return 0
        rc = algorithm_step(self.tables, r, self.keybuf, keylen, take, now, True, &res)
        if rc != FL_OK:
            raise_for(rc)
        return take if res.allowed else 0

    cdef int evaluate(self, const char* client, size_t clen, const char* resource,
                      size_t rlen, int n, int64_t cost, int64_t now_ms,
                      CheckResult* out) except? -100:
        """Checks the n rules in self.order all or nothing: the request
        passes only if every enforcing rule allows it, and only then is
        anything spent.  self.results[i] holds rule i's step; `out` the
        binding rule's (the denying rule with the longest wait, else the
        enforcing rule with the fewest remaining).  Returns FL_OK or an
        FL_E* code."""
        cdef int i, rc, binding = -1
        cdef bint passed = True
        cdef RuleSpec* r
        if self.home_rules and not self.home_local:
            rc = self.route_home(client, clen, n)
            if rc != FL_OK:
                return rc
        if self.split_rules:
            rc = self.choose_subs(&client, &clen, n)
            if rc != FL_OK:
                return rc
        for i in range(n):
            r = &self.rules[self.order[i]]
            if r.nprev and cost > 0:    # a new split's bucket, as full as the old ones
                rc = self.inherit(self.order[i], self.subs[i], client, clen, resource, rlen,
                                  now_ms)
                if rc != FL_OK:
                    return rc
            rc = self.check_rule(self.order[i], self.subs[i], client, clen, resource, rlen,
                                 cost, now_ms, False, &self.results[i])
            if rc == FL_OK and not self.results[i].allowed and self.subs[i] >= 0 and cost > 0:
                rc = self.second_choice(i, client, clen, resource, rlen, cost, now_ms)
            if rc != FL_OK:
                return rc
            if cost == 0:
                # A peek is never denied: a GCRA arrival time or a sliding
                # window's estimate past the limit (a clock that stepped
                # back, a lowered limit) shows as 0 remaining and the wait,
                # as a token bucket or fixed window always show it.
                self.results[i].allowed = 1
                self.results[i].retry_after_ms = 0
            if not self.results[i].allowed and not self.rules[self.order[i]].shadow:
                passed = False
        if passed and cost > 0:    # a peek reads and never writes (on a replica too)
            if self.bound is not None and self.make_room(client, clen, resource, rlen, n,
                                                         now_ms) != FL_OK:
                return FL_EOOM     # before anything is spent: all or nothing holds
            for i in range(n):
                r = &self.rules[self.order[i]]
                if r.shadow and not self.results[i].allowed:
                    continue    # a shadow rule that would deny spends nothing
                rc = self.check_rule(self.order[i], self.subs[i], client, clen, resource,
                                     rlen, cost, now_ms, True, &self.results[i])
                if rc != FL_OK:
                    return rc
                if r.region_sync:     # never split: the key is the one just checked
                    self.log_spend(self.order[i],
                                   4 + clen + (2 + rlen if r.per_resource else 0), cost)
        for i in range(n):
            r = &self.rules[self.order[i]]
            if r.shadow:
                if self.results[i].allowed:
                    r.allowed += passed     # counted as an enforcing rule's would be
                else:
                    r.shadow_denied += 1
                    self.note_denial(now_ms, self.order[i], client, clen, cost)
                continue
            if self.results[i].allowed:
                r.allowed += passed
            else:
                r.denied += 1
                self.note_denial(now_ms, self.order[i], client, clen, cost)
            if binding < 0 or binds_tighter(&self.results[i], &self.results[binding], passed):
                binding = i
        if binding < 0:
            # No enforcing rule applies: allowed, and nothing limits it.
            out.allowed, out.limit, out.remaining = 1, -1, -1
            out.retry_after_ms = out.reset_after_ms = 0
            self.binding_rule = 0
        else:
            out[0] = self.results[binding]
            out.allowed = passed
            self.binding_rule = self.order[binding]
        if self.hot != NULL and fl_hk_due(self.hot):    # one check in the tracker's sample
            self.sample_buckets(client, clen, resource, rlen, n, now_ms)
        return FL_OK

    cdef int sample_buckets(self, const char* client, size_t clen, const char* resource,
                            size_t rlen, int n, int64_t now_ms) except -1:
        """A sampled check: each of its n rules' bucket keys, as
        compose_key writes them, is counted once."""
        cdef int i
        cdef size_t keylen
        if not fl_hk_begin(self.hot, now_ms):
            return 0
        for i in range(n):
            keylen = self.key_of(i, client, clen, resource, rlen)
            fl_hk_count(self.hot, FL_HK_RULE, self.keybuf, keylen)
        return 0

    def track_hot_keys(self, HotKeys tracker):
        """Counts every check's buckets in tracker (None: none)."""
        self.hot_owner = tracker
        self.hot = &tracker.t if tracker is not None else NULL

    cdef void note_denial(self, int64_t now_ms, uint32_t num, const char* client,
                          size_t clen, int64_t cost):
        self.denials_total += 1
        self.recent_denials.append(
            (now_ms, num, PyBytes_FromStringAndSize(client, clen if clen < 256 else 256), cost))

    def limit(self, bytes client, bytes resource, bytes tier=None, int64_t cost=1,
              now_ms=None, bint detail=False):
        """Checks every rule matching (client, resource, tier).  Returns the
        five integers, or with detail (five, [(num, shadow, allowed,
        remaining, retry_after_ms, reset_after_ms), ...])."""
        cdef int n = self.select_rules(
            client, len(client), resource, len(resource),
            <const char*>tier if tier is not None else NULL,
            len(tier) if tier is not None else 0)
        return self.run(client, resource, n, cost, now_ms, detail)

    def apply(self, list nums, bytes client, int64_t cost=1, bytes resource=b"",
              now_ms=None, bint detail=False):
        """The same as limit() for the given rule numbers."""
        cdef int n = self.select_ids(nums)
        return self.run(client, resource, n, cost, now_ms, detail)

    cdef int apply_one(self, uint32_t num, const char* client, size_t clen, int64_t cost,
                       int64_t now_ms, CheckResult* out) except? -100:
        """apply([num], client, cost, now_ms=now_ms) for C callers (the rate
        limit service's decision): FL_OK, or FL_EKEYLEN for a key too long;
        the other refusals raise as apply's do."""
        cdef int n = self.select_ids([num]) if num >= self.nrules or not \
            self.rules[num].in_use or self.rules[num].algorithm == ALG_CONCURRENCY else \
            self.add_selected(num, 0)
        cdef int rc = self.evaluate(client, clen, "", 0, n, cost, now_ms, out)
        if rc == FL_OK or rc == FL_EKEYLEN:
            return rc
        self.raise_refusal(rc, n)
        return rc

    cdef int raise_refusal(self, int rc, int n) except -1:
        """The exception of an evaluate() that did not check: split and home
        refusals by name, the rest by raise_for."""
        if rc == FL_EKEYLEN:
            raise ValueError("key longer than the 65535 bytes a bucket key may have")
        if rc == FL_ESPLIT or rc == FL_ESPLITMIX:
            raise ValueError(self.split_error(rc))
        if rc == FL_EHOME or rc == FL_EHOMEDOWN:
            raise HomeElsewhere(self.home_region, rc == FL_EHOMEDOWN, self.home_fail_closed,
                                [self.order[i] for i in range(n)])
        raise_for(rc)
        return -1

    cdef object run(self, bytes client, bytes resource, int n, int64_t cost, now_ms,
                    bint detail):
        cdef CheckResult out
        cdef int64_t now = self.checked_now(now_ms)
        cdef int rc, i
        if cost < 0:
            raise ValueError("cost must not be negative")
        rc = self.evaluate(client, len(client), resource, len(resource), n, cost, now, &out)
        if rc != FL_OK:
            self.raise_refusal(rc, n)
        five = (out.allowed, out.limit, out.remaining, out.retry_after_ms, out.reset_after_ms)
        return (five, self.last_detail(n)) if detail else five

    cpdef list last_detail(self, int n):
        """The per-rule steps of the last evaluation of n rules:
        [(num, shadow, allowed, remaining, retry_after_ms, reset_after_ms)]."""
        cdef int i
        return [(self.order[i], bool(self.rules[self.order[i]].shadow),
                 self.results[i].allowed, self.results[i].remaining,
                 self.results[i].retry_after_ms, self.results[i].reset_after_ms)
                for i in range(n)]

    # ---- concurrency ------------------------------------------------------------

    def acquire(self, uint32_t num, bytes client, bytes resource=b"", now_ms=None):
        """Takes a lease of concurrency rule `num`: (allowed, limit,
        remaining, retry_after_ms, lease_id), lease_id -1 when denied."""
        cdef CheckResult out
        cdef RuleSpec* r = self.concurrency_rule(num)
        cdef size_t keylen = self.compose_key(num, 0, -1, client, len(client), resource, len(resource))
        cdef int64_t now = self.checked_now(now_ms)
        cdef int rc
        if keylen > FL_MAX_KEY_LEN:
            raise ValueError("key longer than the 65535 bytes a bucket key may have")
        rc = concurrency_acquire(r.leases, self.keybuf, keylen, r, now, &out)
        if rc != FL_OK:
            raise_for(rc)
        if out.allowed:
            r.allowed += 1
        else:
            r.denied += 1
            self.note_denial(now, num, client, len(client), 1)
        return (out.allowed, out.limit, out.remaining, out.retry_after_ms, out.reset_after_ms)

    def release(self, uint32_t num, bytes client, int64_t lease_id, bytes resource=b"",
                now_ms=None):
        """Gives a lease back; True when it was held (not released before,
        not run out)."""
        cdef RuleSpec* r = self.concurrency_rule(num)
        cdef size_t keylen = self.compose_key(num, 0, -1, client, len(client), resource, len(resource))
        if keylen > FL_MAX_KEY_LEN:
            return False
        return concurrency_release(r.leases, self.keybuf, keylen, r, lease_id,
                                   self.checked_now(now_ms)) == 1

    cdef int64_t checked_now(self, now_ms) except? -1:
        """The time a Python-level call runs at: the clock's, or an explicit
        time within the clock's range."""
        if now_ms is None:
            return self.clock.now_ms()
        if not 0 <= now_ms <= MAX_NOW_MS:
            raise ValueError("now_ms out of range: 0 to 4*10^12")
        return now_ms

    cdef RuleSpec* concurrency_rule(self, uint32_t num) except NULL:
        if num >= self.nrules or not self.rules[num].in_use:
            raise KeyError(num)
        if self.rules[num].algorithm != ALG_CONCURRENCY:
            raise ValueError("not a concurrency rule")
        return &self.rules[num]

    # ---- CL.THROTTLE -------------------------------------------------------------

    cdef int throttle_c(self, const char* key, size_t keylen, int64_t burst,
                        int64_t count, int64_t period_ms, int64_t quantity,
                        int64_t now_ms, CheckResult* out) noexcept:
        cdef RuleSpec r
        r.burst = burst
        r.count = count
        r.period_ms = period_ms
        if keylen > FL_MAX_KEY_LEN:
            return FL_EKEYLEN
        return gcra_check(&self.throttle_table, key, keylen, &r, quantity, now_ms, True, out)

    def throttle(self, bytes key, int64_t burst, int64_t count, int64_t period_s,
                 int64_t quantity=1, now_ms=None):
        """redis-cell's CL.THROTTLE: (limited, limit, remaining,
        retry_after_s, reset_after_s); times rounded up to seconds."""
        cdef CheckResult out
        cdef int rc
        err = throttle_params_error(burst, count, period_s, quantity)
        if err is not None:
            raise ValueError(err)
        rc = self.throttle_c(key, len(key), burst, count, period_s * 1000, quantity,
                             self.checked_now(now_ms), &out)
        if rc != FL_OK:
            if rc == FL_EKEYLEN:
                raise ValueError("key longer than 65535 bytes")
            raise_for(rc)
        return throttle_reply(&out)

    # ---- upkeep ------------------------------------------------------------------

    # ---- snapshots ------------------------------------------------------------

    cdef list named_tables(self):
        """(section name, table address): the shared tables by algorithm,
        CL.THROTTLE's, and each concurrency rule's as "leases:<num>"."""
        cdef uint32_t i
        named = [(ALGORITHMS[i].encode(), <size_t>&self.tables[i])
                 for i in range(N_SHARED_TABLES)]
        named.append((b"throttle", <size_t>&self.throttle_table))
        named.extend((b"leases:%d" % i, <size_t>self.rules[i].leases)
                     for i in range(self.nrules) if self.rules[i].leases != NULL)
        return named

    def dump(self, int fd, uint32_t crc=0):
        """Writes every table as a snapshot section; returns (sections,
        crc32 chained from crc)."""
        named = self.named_tables()
        for name, address in named:
            crc = dump_section(<Table*><size_t>address, fd, crc, name)
        return len(named), crc

    def lease_generations(self):
        """{num: generation} of the concurrency rules: a snapshot keeps
        them, so lease ids handed out before a restart are not reused."""
        cdef uint32_t i
        return {i: self.rules[i].lease_generation for i in range(self.nrules)
                if self.rules[i].in_use and self.rules[i].algorithm == ALG_CONCURRENCY}

    def advance_lease_generation(self, uint32_t num, uint32_t generation):
        """Moves a concurrency rule's generation forward to `generation`."""
        if num < self.nrules and self.rules[num].lease_generation < generation:
            self.rules[num].lease_generation = generation

    # ---- replication ---------------------------------------------------------

    def track_changes(self, size_t limit):
        """Starts noting written keys in every table (emptying what was
        noted); limit is each table's log size in bytes."""
        self.change_limit = limit
        for t in self.all_tables():
            if table_track(<Table*><size_t>t, limit) != FL_OK:
                raise MemoryError()

    def untrack_changes(self):
        self.change_limit = 0
        for t in self.all_tables():
            table_untrack(<Table*><size_t>t)

    def changes_overflowed(self):
        return any(log_overflowed(<Table*><size_t>t) for t in self.all_tables())

    def oldest_change_ms(self):
        """Wall time of the oldest change not drained yet, or None."""
        return min(filter(None, [oldest_note(<Table*><size_t>t) for t in self.all_tables()]),
                   default=None)

    def drain_changes(self):
        """The noted keys' states as snapshot sections, in parts (see
        BucketStore.drain_changes), one section per table that changed."""
        sections = []
        for name, address in self.named_tables():
            sections += drain_section(<Table*><size_t>address, name)
        return sections

    def load_section(self, bytes name, uint32_t value_size, const unsigned char[:] data,
                     uint64_t records, list renumber, bint deletes=False):
        """Loads one dumped section.  Rule numbers in keys (and in a lease
        section's name) are mapped through renumber (old number -> new, or
        None for a rule that is gone).  Returns False when the section has
        no table to go to (its rule is gone or changed shape)."""
        cdef Table* t = NULL
        cdef uint32_t old, i
        cdef value_check valid = lease_value_ok
        if name.startswith(b"leases:"):
            digits = name[7:]
            if not digits.isdigit() or len(digits) > 10:
                raise ValueError(f"bad section name {name!r}")
            old = int(digits)
            new = renumber[old] if old < len(renumber) else None
            if new is None or new >= self.nrules or self.rules[<uint32_t>new].leases == NULL:
                return False
            t = self.rules[<uint32_t>new].leases
        elif name == b"throttle":
            t, valid = &self.throttle_table, gcra_value_ok
        else:
            for i in range(N_SHARED_TABLES):
                if ALGORITHMS[i].encode() == name:
                    t, valid = &self.tables[i], VALUE_CHECKS[i]
        if t == NULL or t.wire_value_size != value_size:
            return False
        load_table(t, data, records, None if name == b"throttle" else renumber, valid, deletes)
        return True

    def sweep(self, now_ms=None, double budget_ms=1.0):
        """Drops expired buckets of every table within budget_ms.
        Returns (removed, slots_scanned)."""
        cdef uint64_t scanned = 0, total_scanned = 0, removed = 0
        cdef int64_t now = self.clock.now_ms() if now_ms is None else now_ms
        cdef int64_t deadline = fl_mono_ns() + <int64_t>(budget_ms * 1e6)
        cdef uint32_t now_s = expire_second(now - 999)
        for t in self.all_tables():
            removed += table_sweep(<Table*><size_t>t, now_s, deadline, &scanned)
            total_scanned += scanned
        return removed, total_scanned

    # ---- cluster slots (see BucketStore's) ------------------------------------

    cdef list slot_tables(self):
        """named_tables, each with whether its keys are rule buckets'."""
        return [(name, address, name != b"throttle") for name, address in self.named_tables()]

    def count_in_slot(self, int slot, now_ms=None):
        cdef RuleRoute route = RuleRoute(self.rules, self.nrules)
        return count_in_slot(self.slot_tables(), rule_client_key, &route, checked_slot(slot),
                             self.checked_now(now_ms))

    def keys_in_slot(self, SlotKeys keys, int slot, now_ms=None):
        cdef RuleRoute route = RuleRoute(self.rules, self.nrules)
        keys_in_slot(self.slot_tables(), rule_client_key, &route, checked_slot(slot),
                     self.checked_now(now_ms), keys)

    def export_slots(self, SlotCursor cursor, double budget_ms=1.0,
                     size_t max_bytes=1 << 20):
        """Sections for load_section (rule numbers as snapshot.rule_numbers
        records them)."""
        cdef RuleRoute route = RuleRoute(self.rules, self.nrules)
        return walk_slots(self.slot_tables(), rule_client_key, &route, cursor, budget_ms,
                          max_bytes, False)

    def delete_slots(self, SlotCursor cursor, double budget_ms=1.0):
        cdef RuleRoute route = RuleRoute(self.rules, self.nrules)
        return walk_slots(self.slot_tables(), rule_client_key, &route, cursor, budget_ms,
                          0, True)

    def filter_section(self, bytes mask, bytes name, uint32_t value_size,
                       const unsigned char[:] data, uint64_t records):
        """A drained section's records in mask's slots (see BucketStore's)."""
        cdef RuleRoute route = RuleRoute(self.rules, self.nrules)
        if name == b"throttle":
            return filter_section(name, value_size, data, records, mask, whole_key, NULL)
        return filter_section(name, value_size, data, records, mask, rule_client_key, &route)

    cdef list all_tables(self):
        """Addresses of every table (see named_tables)."""
        return [address for _, address in self.named_tables()]

    def clear(self):
        for t in self.all_tables():
            table_clear(<Table*><size_t>t)

    def __len__(self):
        return sum(table_count(<Table*><size_t>t) for t in self.all_tables())

    @property
    def memory_bytes(self):
        return sum(table_memory(<Table*><size_t>t) for t in self.all_tables())

    @property
    def expired_total(self):
        return sum((<Table*><size_t>t).expired for t in self.all_tables())


cdef void release_lease_table(RuleSpec* r) noexcept:
    if r.leases != NULL:
        table_free(r.leases)
        free(r.leases)
        r.leases = NULL


cdef inline bint binds_tighter(const CheckResult* a, const CheckResult* b, bint passed) noexcept:
    """Whether result a should describe the request rather than b: when
    denied, the longest wait (-1, never, is longest); when allowed, the
    fewest remaining."""
    if not passed:
        if a.allowed != b.allowed:
            return not a.allowed
        if a.retry_after_ms == -1 or b.retry_after_ms == -1:
            return a.retry_after_ms == -1 and b.retry_after_ms != -1
        return a.retry_after_ms > b.retry_after_ms
    return a.remaining < b.remaining


def throttle_params_error(int64_t burst, int64_t count, int64_t period_s, int64_t quantity):
    """Why CL.THROTTLE's numbers are unusable, or None.  redis-cell crashes
    on a zero count or period; here they are errors."""
    if not 0 <= burst <= MAX_GCRA_BURST:
        return f"max_burst must be an integer from 0 to {MAX_GCRA_BURST}"
    if not 1 <= count <= MAX_GCRA_COUNT:
        return f"count per period must be an integer from 1 to {MAX_GCRA_COUNT}"
    if not 1 <= period_s <= MAX_WINDOW_MS // 1000:
        return f"period must be an integer from 1 to {MAX_WINDOW_MS // 1000} seconds"
    if not 0 <= quantity <= MAX_LIMIT:
        return "quantity must be an integer from 0 to 10^15"
    if <fl_i128>period_s * 1000 * (burst + 1) > MAX_GCRA_TOLERANCE:
        return "period * (max_burst + 1) is too long"
    return None


cdef tuple throttle_reply(const CheckResult* out):
    # redis-cell: [limited, limit, remaining, retry_after_s (-1 when
    # allowed), reset_after_s]; seconds rounded up, not down (a fix).
    return (0 if out.allowed else 1, out.limit, out.remaining,
            -1 if out.allowed else (-1 if out.retry_after_ms < 0
                                    else (out.retry_after_ms + 999) // 1000),
            (out.reset_after_ms + 999) // 1000)
