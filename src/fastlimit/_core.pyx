# cython: freethreading_compatible=False
"""The engine: sharded open-addressing tables of packed records, the
token bucket, and the incremental sweep that drops full buckets.

Layout and contracts are documented in _core.pxd.
"""

from libc.stdint cimport int64_t, uint64_t, uint32_t, uint16_t, uint8_t, UINT32_MAX, INT64_MAX
from libc.errno cimport errno, EINTR
from libc.stdlib cimport malloc, calloc, realloc, free
from libc.string cimport memcpy, memcmp, memset
from posix.unistd cimport write

cimport cython

from fastlimit._cluster cimport key_slot, CLUSTER_SLOTS

import os
import struct

from fastlimit._resp import ReplyError

# Redis's words for a write refused under maxmemory.
OOM_ERROR = "OOM command not allowed when used memory > 'maxmemory'."


class OutOfMemory(ReplyError, MemoryError):
    """A new bucket refused under maxmemory (noeviction, or nothing left to
    evict); a command handler's reply is Redis's OOM error."""

    def __init__(self):
        super().__init__(OOM_ERROR)


cdef object raise_for(int rc):
    """The exception for a table call's failure code."""
    if rc == FL_EOOM:
        raise OutOfMemory()
    raise MemoryError()

cdef enum:
    MIN_SLOTS = 8
    MIN_ARENA = 256
    # Arena offset 0 means "empty slot", so records start past it.
    ARENA_START = 8
    # Deadline is checked every this many slots visited by the sweep.
    SWEEP_CHECK_EVERY = 32
    # An eviction round frees this share of one shard's arena (then
    # compacts it): large enough that compactions are rare, small enough
    # that a round stays short (a 200mb bound: ~50 KB, ~900 buckets).
    EVICT_SHARE = 16
    # Random slots tried for an occupied one before walking to the next.
    RANDOM_TRIES = 32
    # Draws of maxmemory-samples records before nearest-full evicts an
    # exhausted bucket: a shard holds a few dozen buckets under a small
    # bound, and one draw of five all landing on its few exhausted ones
    # cost a victim in 3 of 20,000 floods of 15,000 keys (in a shard a
    # quarter exhausted, one draw in 1,024; four in a row, one in 2^40).
    EXHAUSTED_DRAWS = 4

# slots_place could not place a key
cdef uint32_t NO_SLOT = UINT32_MAX

# A record's limit wholly spent, in record_spent's units.
cdef uint64_t SPENT_ALL = (<uint64_t>1) << SPENT_BITS


# ---- slot arithmetic --------------------------------------------------------

cdef inline uint32_t home_slot(uint32_t h, uint32_t nslots) noexcept nogil:
    # Lemire's fast range reduction: no power-of-two table sizes needed,
    # so tables can grow by 1.5x and stay dense.
    return <uint32_t>((<uint64_t>h * nslots) >> 32)


cdef inline uint32_t next_slot(uint32_t i, uint32_t nslots) noexcept nogil:
    i += 1
    return 0 if i == nslots else i


cdef inline uint8_t tag_of(uint32_t h32) noexcept nogil:
    # the low bits: home_slot's reduction takes the high ones
    return <uint8_t>h32


cdef inline bint needs_growth(const Shard* s) noexcept nogil:
    # past 9/10 full: Robin Hood keeps probes short there (a lookup reads
    # a few contiguous 6-byte slots, one or two cache lines)
    return (<uint64_t>s.count + 1) * 10 > <uint64_t>s.nslots * 9


cdef inline bint wants_shrink(const Shard* s) noexcept nogil:
    return s.nslots > MIN_SLOTS and <uint64_t>s.count * 5 < s.nslots


# ---- shard maintenance --------------------------------------------------------

cdef int shard_init(Shard* s) noexcept nogil:
    s.nslots = MIN_SLOTS
    s.count = 0
    s.slots = <Slot*>fl_mem_alloc(MIN_SLOTS * sizeof(Slot))
    s.arena_cap = MIN_ARENA
    s.arena = <char*>fl_mem_alloc(MIN_ARENA)
    s.arena_len = ARENA_START
    s.dead = 0
    if s.slots == NULL or s.arena == NULL:
        return FL_ENOMEM
    return FL_OK


cdef void shard_free(Shard* s) noexcept nogil:
    if s.slots != NULL:
        fl_mem_free(s.slots, s.nslots * sizeof(Slot))
    if s.arena != NULL:
        fl_mem_free(s.arena, s.arena_cap)
    s.slots = NULL
    s.arena = NULL


cdef inline uint32_t record_hash(const Table* t, const char* rec) noexcept nogil:
    """The 32-bit slot hash of a record's key (a slot keeps only 8 bits)."""
    return <uint32_t>fl_siphash13(record_key(t, rec), record_keylen(t, rec), t.seed)


cdef uint32_t slots_place(Slot* slots, uint32_t nslots, uint32_t home, uint8_t tag,
                          uint32_t off) noexcept nogil:
    """Robin Hood insertion of a key known to be absent: it takes the
    first slot whose entry is nearer its own home, and the entries from
    there to the next empty slot move one further.  Returns the key's slot,
    or NO_SLOT with nothing changed when one of them would pass MAX_DIST
    (the shard must grow)."""
    cdef uint32_t i = home, d = 0, end, prev
    while slots[i].off != 0 and slots[i].dist >= d:
        d += 1
        i = next_slot(i, nslots)
    if d > MAX_DIST:
        return NO_SLOT
    end = i
    while slots[end].off != 0:
        if slots[end].dist == MAX_DIST:
            return NO_SLOT
        end = next_slot(end, nslots)
    while end != i:                 # shift [i, end) one slot on
        prev = end - 1 if end > 0 else nslots - 1
        slots[end] = slots[prev]
        slots[end].dist += 1
        end = prev
    slots[i].off = off
    slots[i].dist = <uint8_t>d
    slots[i].tag = tag
    return i


cdef int shard_rehash(const Table* t, Shard* s, uint32_t nslots) noexcept nogil:
    """Places every record in a new array of `nslots`, hashing each key
    again; FL_ENOMEM leaves the shard as it was."""
    cdef Slot* fresh = <Slot*>fl_mem_alloc(nslots * sizeof(Slot))
    cdef uint32_t i, moved = 0
    invariant(nslots > s.count)
    if fresh == NULL:
        return FL_ENOMEM
    for i in range(s.nslots):
        if s.slots[i].off != 0:
            if slots_place(fresh, nslots,
                           home_slot(record_hash(t, s.arena + s.slots[i].off), nslots),
                           s.slots[i].tag, s.slots[i].off) == NO_SLOT:
                fl_mem_free(fresh, nslots * sizeof(Slot))
                return FL_ENOMEM
            moved += 1
    invariant(moved == s.count)
    fl_mem_free(s.slots, s.nslots * sizeof(Slot))
    s.slots = fresh
    s.nslots = nslots
    invariant(shard_consistent(t, s))
    return FL_OK


cdef bint slots_well_formed(const Shard* s) noexcept nogil:
    """The Robin Hood shape, for the debug build's assertions: no entry is
    further from its home than the one before it allows (so a lookup
    reaches it), and `count` entries in all.  Reads the slots only: cheap
    enough after every compaction (each eviction round ends with one), so
    the deletes before it are checked."""
    cdef uint32_t i, n = 0, prev
    for i in range(s.nslots):
        if s.slots[i].off == 0:
            continue
        n += 1
        prev = i - 1 if i > 0 else s.nslots - 1
        if s.slots[i].dist > 0 and (s.slots[prev].off == 0 or
                                    s.slots[prev].dist + 1 < s.slots[i].dist):
            return False
    return n == s.count


cdef bint shard_consistent(const Table* t, const Shard* s) noexcept nogil:
    """slots_well_formed, and every entry `dist` slots past its key's home
    with its key's tag: after a rehash, which hashes every key anyway."""
    cdef uint32_t i, h32
    cdef uint64_t dist
    for i in range(s.nslots):
        if s.slots[i].off == 0:
            continue
        h32 = record_hash(t, s.arena + s.slots[i].off)
        dist = (<uint64_t>i + s.nslots - home_slot(h32, s.nslots)) % s.nslots
        if dist != s.slots[i].dist or s.slots[i].tag != tag_of(h32):
            return False
    return slots_well_formed(s)


cdef inline uint64_t grown_nslots(const Shard* s) noexcept nogil:
    # by a third: the slots stay between 67% and 90% full as keys come (by
    # a half, 60%: a byte more per key; by a quarter, more rehashing)
    cdef uint64_t target = <uint64_t>s.nslots * 4 // 3
    cdef uint64_t floor_for_load = (<uint64_t>s.count + 1) * 10 // 9 + 1
    return target if target > floor_for_load else floor_for_load


cdef int shard_grow(const Table* t, Shard* s) noexcept nogil:
    cdef uint64_t target = grown_nslots(s)
    if target > UINT32_MAX - 16:
        return FL_ENOMEM
    return shard_rehash(t, s, <uint32_t>target)


cdef int shard_shrink(const Table* t, Shard* s) noexcept nogil:
    cdef uint32_t target = s.count * 2
    if target < MIN_SLOTS:
        target = MIN_SLOTS
    return shard_rehash(t, s, target)


cdef int shard_compact(Table* t, Shard* s) noexcept nogil:
    """Copies live records into a fresh arena sized to fit them, giving
    the space of deleted records back."""
    cdef size_t live = s.arena_len - s.dead
    cdef size_t cap = live + live // 4 + MIN_ARENA
    cdef char* fresh = <char*>fl_mem_alloc(cap)
    cdef size_t pos = ARENA_START, n
    cdef uint32_t i
    cdef char* rec
    if fresh == NULL:
        return FL_ENOMEM
    for i in range(s.nslots):
        if s.slots[i].off != 0:
            rec = s.arena + s.slots[i].off
            n = record_size(t, rec)
            memcpy(fresh + pos, rec, n)
            s.slots[i].off = <uint32_t>pos
            pos += n
    invariant(pos == live)   # live counts the reserved start too
    t.relocations += 1       # arena cursors (ArenaCursor) walk this shard again
    account(t, <ssize_t>pos - <ssize_t>s.arena_len)
    fl_mem_free(s.arena, s.arena_cap)
    s.arena = fresh
    s.arena_cap = cap
    s.arena_len = pos
    s.dead = 0
    invariant(slots_well_formed(s))
    return FL_OK


cdef int shard_reserve(Shard* s, size_t n) noexcept nogil:
    cdef size_t cap
    cdef char* bigger
    if s.arena_len + n <= s.arena_cap:
        return FL_OK
    cap = s.arena_cap + s.arena_cap // 2 + n
    if cap > UINT32_MAX:
        return FL_ENOMEM   # offsets are 32-bit; more shards lift this
    bigger = <char*>fl_mem_realloc(s.arena, s.arena_cap, cap)
    if bigger == NULL:
        return FL_ENOMEM
    s.arena = bigger
    s.arena_cap = cap
    return FL_OK


cdef inline size_t slot_bytes(const Shard* s) noexcept nogil:
    return s.nslots * sizeof(Slot)


cdef inline void account(Table* t, ssize_t delta) noexcept nogil:
    """Keeps the bound's count of the table's bytes (table_memory's
    measure) when there is a bound."""
    if t.bound != NULL:
        t.mem += delta
        t.bound.used += delta


cdef void shard_maintain(Table* t, Shard* s) noexcept nogil:
    # Failures here only mean the memory is not returned yet; the shard
    # stays valid either way.
    cdef size_t before = slot_bytes(s)
    if wants_shrink(s):
        shard_shrink(t, s)
        account(t, <ssize_t>slot_bytes(s) - <ssize_t>before)
    if s.dead * 2 > s.arena_len:
        shard_compact(t, s)


# ---- table API ----------------------------------------------------------------

cdef int table_init(Table* t, uint32_t nshards, uint32_t value_size,
                    const uint8_t* seed) noexcept nogil:
    cdef uint32_t i
    t.log = NULL
    t.spent = NULL
    t.spent_ctx = NULL
    t.bound = NULL
    t.bound_next = NULL
    t.mem = 0
    t.evict_shard = 0
    t.nshards = nshards
    t.value_size = value_size
    t.wire_value_size = value_size
    t.to_wire = NULL
    t.from_wire = NULL
    t.long_keys = 0
    memcpy(t.seed, seed, 16)
    t.sweep_shard = 0
    t.sweep_slot = 0
    t.expired = 0
    t.relocations = 0
    t.shards = <Shard*>fl_mem_alloc(nshards * sizeof(Shard))
    if t.shards == NULL:
        return FL_ENOMEM
    for i in range(nshards):
        if shard_init(&t.shards[i]) != FL_OK:
            table_free(t)
            return FL_ENOMEM
    return FL_OK


cdef void bucket_to_wire(const char* v, char* wire) noexcept nogil:
    fl_put_i64(wire, bucket_tokens(v))
    fl_put_i64(wire + 8, bucket_last(v))
    fl_put_u32(wire + 16, bucket_fraction(v))


cdef void bucket_from_wire(const char* wire, char* v) noexcept nogil:
    # bucket_value_ok has checked the ranges bucket_put needs
    bucket_put(v, fl_get_i64(wire), fl_get_i64(wire + 8), fl_get_u32(wire + 16))


cdef int bucket_table_init(Table* t, uint32_t nshards, const uint8_t* seed) noexcept nogil:
    cdef int rc = table_init(t, nshards, BUCKET_STORED_SIZE, seed)
    t.wire_value_size = BUCKET_VALUE_SIZE
    t.to_wire = bucket_to_wire
    t.from_wire = bucket_from_wire
    return rc


cdef void table_free(Table* t) noexcept nogil:
    cdef uint32_t i
    table_untrack(t)
    bound_detach(t)
    if t.shards == NULL:
        return
    for i in range(t.nshards):
        shard_free(&t.shards[i])
    fl_mem_free(t.shards, t.nshards * sizeof(Shard))
    t.shards = NULL


cdef int table_clear(Table* t) noexcept nogil:
    cdef uint32_t i
    cdef int rc = FL_OK
    for i in range(t.nshards):
        shard_free(&t.shards[i])
        if shard_init(&t.shards[i]) != FL_OK:
            rc = FL_ENOMEM
    t.sweep_shard = 0
    t.sweep_slot = 0
    t.relocations += 1
    t.long_keys = 0
    if t.bound != NULL:
        account(t, <ssize_t>table_memory(t) - <ssize_t>t.mem)
    return rc


cdef bint table_lookup(Table* t, const char* key, size_t keylen,
                       Probe* p) noexcept nogil:
    return lookup_hashed(t, fl_siphash13(key, keylen, t.seed), key, keylen, p)


cdef inline Shard* shard_of(Table* t, uint64_t h) noexcept nogil:
    return &t.shards[(h >> 32) & (t.nshards - 1)]


cdef inline bint lookup_hashed(Table* t, uint64_t h, const char* key, size_t keylen,
                               Probe* p) noexcept nogil:
    cdef Shard* s = shard_of(t, h)
    cdef uint32_t h32 = <uint32_t>h
    cdef uint32_t i = home_slot(h32, s.nslots), d = 0
    cdef uint8_t tag = tag_of(h32)
    cdef const char* rec
    p.shard = s
    p.hash = h32
    # Robin Hood: past an entry nearer its home than we are to ours, the
    # key would have taken that slot, so it is absent.
    while s.slots[i].off != 0 and s.slots[i].dist >= d:
        if s.slots[i].dist == d and s.slots[i].tag == tag:
            rec = s.arena + s.slots[i].off
            if record_keylen(t, rec) == keylen and memcmp(
                    record_key(t, rec), key, keylen) == 0:
                p.slot = i
                p.dist = d
                p.found = True
                return True
        d += 1
        i = next_slot(i, s.nslots)
    p.slot = i
    p.dist = d
    p.found = False
    return False


cdef char* probe_record(Table* t, const Probe* p) noexcept nogil:
    return p.shard.arena + p.shard.slots[p.slot].off


cdef bint record_live(Table* t, const Probe* p, int64_t now_ms) noexcept nogil:
    """Whether the probe found a record whose expiry has not passed; an
    expired record not yet swept reads as no record."""
    return p.found and now_ms < <int64_t>fl_get_u32(probe_record(t, p)) * 1000


cdef char* probe_value(Table* t, const Probe* p) noexcept nogil:
    return p.shard.arena + p.shard.slots[p.slot].off + RECORD_HEADER


cdef void probe_at(const Table* t, Shard* s, uint32_t slot, Probe* p) noexcept nogil:
    invariant(s.slots[slot].off != 0)
    p.shard = s
    p.slot = slot
    p.hash = record_hash(t, s.arena + s.slots[slot].off)
    p.dist = s.slots[slot].dist
    p.found = True


cdef size_t insert_cost(const Table* t, const Shard* s, size_t keylen) noexcept nogil:
    """Bytes a new record adds to the bound's count: itself, and the
    larger slot array when the shard must grow for it."""
    cdef size_t n = stored_size(t, keylen)
    if needs_growth(s):
        n += (grown_nslots(s) - s.nslots) * sizeof(Slot)
    return n


cdef int table_insert(Table* t, Probe* p, const char* key, size_t keylen,
                      uint32_t expire_s, const char* value, int64_t now_ms) noexcept nogil:
    """Adds a record for a key that `p` says is absent, first making room
    under the table's memory bound when it has one (FL_EOOM when none can
    be made)."""
    cdef size_t need
    cdef MemBound* b = t.bound
    if b != NULL and keylen <= FL_MAX_KEY_LEN:
        need = insert_cost(t, p.shard, keylen)
        if b.used + need > b.limit:
            if bound_reclaim(b, need, INSERT_ROUNDS, INT64_MAX, now_ms) != FL_OK:
                return FL_EOOM
    return table_append(t, p, key, keylen, expire_s, value)


cdef inline int table_append(Table* t, Probe* p, const char* key, size_t keylen,
                             uint32_t expire_s, const char* value) noexcept nogil:
    """table_insert without the bound: what loads use (a replica follows
    its primary's evictions instead of making its own, and a snapshot or
    an imported slot is taken whole, as Redis loads an RDB)."""
    cdef Shard* s = p.shard
    cdef size_t n = stored_size(t, keylen)
    cdef size_t slots_before
    cdef uint32_t slot
    cdef char* rec
    if keylen > FL_MAX_KEY_LEN:
        return FL_EKEYLEN
    if shard_reserve(s, n) != FL_OK:
        return FL_ENOMEM
    invariant(not p.found)
    rec = s.arena + s.arena_len
    fl_put_u32(rec, expire_s)
    memcpy(rec + RECORD_HEADER, value, t.value_size)
    if keylen < KEYLEN_LONG:
        rec[4] = <char>keylen
    else:
        rec[4] = <char>KEYLEN_LONG
        fl_put_u16(rec + RECORD_HEADER + t.value_size, <uint16_t>keylen)
    memcpy(<char*>record_key(t, rec), key, keylen)
    slots_before = slot_bytes(s)
    if needs_growth(s) and shard_grow(t, s) != FL_OK:
        return FL_ENOMEM
    # placed again from its home: a grow, or the evictions table_insert
    # made room with, may have moved the slot the lookup found
    slot = slots_place(s.slots, s.nslots, home_slot(p.hash, s.nslots), tag_of(p.hash),
                       <uint32_t>s.arena_len)
    while slot == NO_SLOT:
        if shard_grow(t, s) != FL_OK:     # a probe run past MAX_DIST
            return FL_ENOMEM
        slot = slots_place(s.slots, s.nslots, home_slot(p.hash, s.nslots), tag_of(p.hash),
                           <uint32_t>s.arena_len)
    account(t, <ssize_t>slot_bytes(s) - <ssize_t>slots_before)
    p.slot = slot
    p.dist = s.slots[slot].dist
    s.arena_len += n
    s.count += 1
    t.long_keys += keylen >= KEYLEN_LONG     # only once the record is in
    p.found = True
    account(t, n)
    return FL_OK


cdef void table_delete(Table* t, Probe* p) noexcept nogil:
    """Removes the record `p` found, moving the entries after it that are
    not at their home one slot back (Robin Hood: no tombstones)."""
    cdef Shard* s = p.shard
    cdef uint32_t hole = p.slot, j = next_slot(p.slot, s.nslots)
    invariant(p.found and s.count > 0 and s.slots[hole].off != 0)
    s.dead += record_size(t, s.arena + s.slots[hole].off)
    t.long_keys -= long_key(s.arena + s.slots[hole].off)
    s.count -= 1
    while s.slots[j].off != 0 and s.slots[j].dist > 0:
        s.slots[hole] = s.slots[j]
        s.slots[hole].dist -= 1
        hole = j
        j = next_slot(j, s.nslots)
    s.slots[hole].off = 0
    s.slots[hole].dist = 0
    s.slots[hole].tag = 0
    p.found = False


# ---- the memory bound (maxmemory) ------------------------------------------------
#
# A full bucket is the same as no bucket: forgetting a record grants what
# its limit has spent.  So the record whose loss costs the least protection
# is the least spent relative to its own limit (record_rank: an expired one
# not yet swept is the best of all), and an exhausted bucket, the one that
# limits someone, goes last whatever limits the rest have.  Not the one
# soonest full: a daily quota's key one call touched is full again later
# than an exhausted per-minute login bucket, and would outlast it.

cdef void bound_attach(MemBound* b, Table* t) noexcept nogil:
    if t.bound == b:
        return
    bound_detach(t)
    t.mem = table_memory(t)
    t.bound = b
    t.bound_next = b.tables
    b.tables = t
    b.used += t.mem


cdef void bound_detach(Table* t) noexcept nogil:
    cdef Table** link
    if t.bound == NULL:
        return
    link = &t.bound.tables
    while link[0] != NULL and link[0] != t:
        link = &link[0].bound_next
    if link[0] == t:
        link[0] = t.bound_next
    t.bound.used -= t.mem
    t.bound = NULL
    t.bound_next = NULL
    t.mem = 0


cdef inline uint64_t bound_random(MemBound* b) noexcept nogil:
    # xorshift64: the samples need spread, not secrecy
    b.rng ^= b.rng << 13
    b.rng ^= b.rng >> 7
    b.rng ^= b.rng << 17
    return b.rng


cdef uint32_t random_occupied(MemBound* b, const Shard* s) noexcept nogil:
    """A uniformly random occupied slot of a non-empty shard: random slots
    until one is occupied (a shard's load stays above a fifth).  Not the
    first occupied slot after a random one: that favours slots after long
    empty runs, and a bucket there would be sampled again and again until
    some eviction drew only it."""
    cdef uint32_t tries, i = 0
    for tries in range(RANDOM_TRIES):
        i = <uint32_t>(bound_random(b) % s.nslots)
        if s.slots[i].off != 0:
            return i
    while s.slots[i].off == 0:      # a very sparse shard: any will do
        i = next_slot(i, s.nslots)
    return i


cdef uint64_t spent_share(fl_i128 part, fl_i128 whole) noexcept nogil:
    """part / whole in units of 2^-SPENT_BITS, 0 to SPENT_ALL; part and
    whole below 2^94, so the shifted part stays an i128."""
    if part <= 0:
        return 0
    if part >= whole:
        return SPENT_ALL
    return <uint64_t>((part << SPENT_BITS) // whole)


cdef inline int64_t ms_to_full(const char* rec, int64_t now_ms) noexcept nogil:
    """Time until a bucket record's expiry second, when it is full again
    (at most 2^32 s: below 2^42 ms)."""
    return <int64_t>fl_get_u32(rec) * 1000 - now_ms


cdef uint64_t bucket_spent(const char* rec, uint32_t value_size, const void* ctx,
                           int64_t now_ms) noexcept nogil:
    """A CL.CHECK bucket's spent share.  Its record keeps no capacity or
    rate (each call brings them), so its whole refill time is estimated:
    what was missing at the last write took (expiry - last) to refill,
    and the estimate takes it to be one token's worth on top of the whole
    tokens the bucket then held (tokens // 1000 + 1 tokens in all).  Exact
    for a bucket held under one token (exhausted: the estimate is the
    time to full itself, so it ranks as spent as it is) and for one a
    single call of cost 1 took one token from (what a flood of new keys
    leaves, whatever its limit: 1 / capacity); a bucket missing several
    tokens ranks as less spent than it is, never an exhausted one as less
    than one such flood key.  Bounds: time to full < 2^42 ms (an expiry
    second is a u32, a write's time is not before 0) and whole tokens <=
    10^15 < 2^50, so the estimate is below 2^93 ms."""
    cdef int64_t last = bucket_last(rec + RECORD_HEADER)
    cdef int64_t tokens = bucket_tokens(rec + RECORD_HEADER)
    cdef int64_t at_write = ms_to_full(rec, last if last < now_ms else now_ms)
    return spent_share(ms_to_full(rec, now_ms), <fl_i128>at_write * (tokens // 1000 + 1))


cdef inline uint64_t record_rank(const Table* t, const char* rec, int64_t now_ms) noexcept nogil:
    """What nearest-full evicts the smallest of: the record's spent share,
    or its expiry second in a table that has no measure of it."""
    if t.spent != NULL:
        return t.spent(rec, t.value_size, t.spent_ctx, now_ms)
    return fl_get_u32(rec)


cdef uint32_t pick_victim(MemBound* b, const Table* t, const Shard* s,
                          int64_t now_ms) noexcept nogil:
    """The slot of the least spent of `samples` random occupied slots of
    a non-empty shard (any of them under allkeys-random); when every one
    drawn is exhausted, of up to EXHAUSTED_DRAWS draws of `samples`."""
    cdef uint32_t k, i, best = 0
    cdef uint64_t rank, best_rank = SPENT_ALL + 1     # above every rank (an expiry second too)
    for k in range(b.samples * EXHAUSTED_DRAWS):
        if k > 0 and k % b.samples == 0 and best_rank < SPENT_ALL:
            break
        i = random_occupied(b, s)
        if b.policy == EVICT_RANDOM:
            return i
        rank = record_rank(t, s.arena + s.slots[i].off, now_ms)
        if rank < best_rank:
            best, best_rank = i, rank
    return best


cdef uint64_t shard_evict(MemBound* b, Table* t, Shard* s, size_t goal,
                          int64_t now_ms) noexcept nogil:
    """Evicts sampled records until `goal` bytes of the shard are dead or
    it is empty.  Each is noted as a change, so standbys drop it too (the
    drain ships a tombstone for a key that is gone)."""
    cdef uint64_t evicted = 0
    cdef const char* rec
    cdef Probe p
    while s.dead < goal and s.count > 0:
        probe_at(t, s, pick_victim(b, t, s, now_ms), &p)
        rec = s.arena + s.slots[p.slot].off
        table_delete(t, &p)     # the record stays readable in the arena until compaction
        note_change(t, &p, record_key(t, rec), record_keylen(t, rec))
        evicted += 1
    b.evicted += evicted
    return evicted


cdef Table* biggest_table(const MemBound* b) noexcept nogil:
    cdef Table* t = b.tables
    cdef Table* big = t
    while t != NULL:
        if t.mem > big.mem:
            big = t
        t = t.bound_next
    return big


cdef Shard* deadest_shard(Table* t) noexcept nogil:
    cdef Shard* best = &t.shards[0]
    cdef uint32_t i
    for i in range(1, t.nshards):
        if t.shards[i].dead > best.dead:
            best = &t.shards[i]
    return best


cdef Shard* next_evict_shard(Table* t) noexcept nogil:
    """The next non-empty shard round the table (NULL: all are empty)."""
    cdef uint32_t k
    cdef Shard* s
    for k in range(t.nshards):
        s = &t.shards[t.evict_shard]
        t.evict_shard = (t.evict_shard + 1) & (t.nshards - 1)
        if s.count > 0:
            return s
    return NULL


cdef inline size_t round_goal(const Shard* s, size_t need) noexcept nogil:
    cdef size_t share = s.arena_len // EVICT_SHARE
    return share if share > need else need


cdef void give_back(Table* t, Shard* s) noexcept nogil:
    """Returns a shard's dead bytes, and its slots when few are in use (as
    the sweep's shard_maintain would, later): a bound lowered far must not
    empty shards whose slot arrays still hold the bytes."""
    cdef size_t before = slot_bytes(s)
    if wants_shrink(s) and shard_shrink(t, s) == FL_OK:
        account(t, <ssize_t>slot_bytes(s) - <ssize_t>before)
    shard_compact(t, s)


cdef int bound_reclaim(MemBound* b, size_t need, int rounds,
                       int64_t deadline_ns, int64_t now_ms) noexcept nogil:
    """Rounds over the biggest attached table: compact its shard with the
    most dead bytes when that frees a round's worth, else (unless the
    policy is noeviction) evict a round's worth from its next shard and
    compact that.  Compacting is what gives bytes back: an arena is
    append-only, a deleted record's bytes stay until then."""
    cdef size_t before = b.used
    cdef Table* t
    cdef Shard* s
    while b.used + need > b.limit and rounds > 0 and b.tables != NULL:
        rounds -= 1
        t = biggest_table(b)
        s = deadest_shard(t)
        if s.dead < round_goal(s, need):
            if b.policy == EVICT_NONE:
                break
            s = next_evict_shard(t)
            if s == NULL:
                break
            shard_evict(b, t, s, round_goal(s, need), now_ms)
        give_back(t, s)
        if deadline_ns != INT64_MAX and fl_mono_ns() > deadline_ns:
            break
    if b.used + need <= b.limit or before >= b.used + need:
        return FL_OK
    return FL_EOOM


cdef uint64_t table_count(const Table* t) noexcept nogil:
    cdef uint64_t n = 0
    cdef uint32_t i
    for i in range(t.nshards):
        n += t.shards[i].count
    return n


cdef size_t table_memory(const Table* t) noexcept nogil:
    """Bytes the tables hold: slots, and the used part of each arena (the
    unused tail of an arena is address space the kernel has not backed)."""
    cdef size_t n = t.nshards * sizeof(Shard)
    cdef uint32_t i
    for i in range(t.nshards):
        n += t.shards[i].nslots * sizeof(Slot) + t.shards[i].arena_len
    return n


cdef uint64_t table_sweep(Table* t, uint32_t now_s, int64_t deadline_ns,
                          uint64_t* scanned) noexcept nogil:
    """Visits slots from where the last sweep stopped, dropping records
    whose expiry second has passed, until one full pass over every slot
    is done or the deadline passes.  Returns how many were dropped.  A
    pass that resumes inside a shard ends with that shard again from its
    start: its first slots were visited by an earlier sweep, at an earlier
    time, when their records may not yet have expired."""
    cdef uint64_t removed = 0, visited = 0
    cdef uint32_t shards_done = 0
    cdef uint32_t passes = t.nshards + (1 if t.sweep_slot > 0 else 0)
    cdef Shard* s
    cdef Probe p
    while shards_done < passes:
        s = &t.shards[t.sweep_shard]
        while t.sweep_slot < s.nslots:
            visited += 1
            if visited % SWEEP_CHECK_EVERY == 0 and fl_mono_ns() > deadline_ns:
                scanned[0] = visited
                t.expired += removed
                return removed
            if (s.slots[t.sweep_slot].off != 0 and
                    fl_get_u32(s.arena + s.slots[t.sweep_slot].off) <= now_s):
                p.shard = s
                p.slot = t.sweep_slot
                p.found = True
                table_delete(t, &p)
                removed += 1
                continue   # a later entry may have shifted into this slot
            t.sweep_slot += 1
        shard_maintain(t, s)
        t.sweep_slot = 0
        t.sweep_shard = (t.sweep_shard + 1) & (t.nshards - 1)
        shards_done += 1
    scanned[0] = visited
    t.expired += removed
    return removed


# ---- snapshots ---------------------------------------------------------------------

cdef enum:
    DUMP_BUFFER = 1 << 16


cdef int write_all(int fd, const char* buf, size_t n, uint32_t* crc) noexcept nogil:
    cdef ssize_t done
    crc[0] = fl_crc32(crc[0], buf, n)
    while n > 0:
        done = write(fd, buf, n)
        if done < 0:
            if errno == EINTR:
                continue
            return FL_EIO
        buf += done
        n -= <size_t>done
    return FL_OK


cdef size_t record_to_wire(const Table* t, const char* rec, char* out) noexcept nogil:
    """Writes a record's wire form (see _core.pxd) to out; returns its size."""
    cdef size_t keylen = record_keylen(t, rec)
    memcpy(out, rec, 4)
    fl_put_u16(out + 4, <uint16_t>keylen)
    if t.to_wire != NULL:
        t.to_wire(rec + RECORD_HEADER, out + WIRE_HEADER)
    else:
        memcpy(out + WIRE_HEADER, rec + RECORD_HEADER, t.value_size)
    memcpy(out + WIRE_HEADER + t.wire_value_size, record_key(t, rec), keylen)
    return WIRE_HEADER + t.wire_value_size + keylen


cdef inline size_t wire_size(const Table* t, size_t keylen) noexcept nogil:
    return WIRE_HEADER + t.wire_value_size + keylen


cdef int table_dump(const Table* t, int fd, uint32_t* crc,
                    uint64_t* records) noexcept nogil:
    """Writes every record in its wire form, expired or not (a loader
    drops the expired ones as the sweep would)."""
    # room for any one record: a key of at most 64 KiB and its value
    cdef size_t cap = DUMP_BUFFER + wire_size(t, FL_MAX_KEY_LEN)
    cdef char* buf = <char*>malloc(cap)
    cdef size_t used = 0
    cdef uint32_t i, j
    cdef int rc
    cdef const Shard* s
    records[0] = 0
    if buf == NULL:
        return FL_ENOMEM
    for i in range(t.nshards):
        s = &t.shards[i]
        for j in range(s.nslots):
            if s.slots[j].off == 0:
                continue
            if used >= DUMP_BUFFER:
                if write_all(fd, buf, used, crc) != FL_OK:
                    free(buf)
                    return FL_EIO
                used = 0
            used += record_to_wire(t, s.arena + s.slots[j].off, buf + used)
            records[0] += 1
    rc = write_all(fd, buf, used, crc) if used else FL_OK
    free(buf)
    return rc


cdef enum:
    LOAD_CHUNK = 64     # records whose cache lines are requested before any is used


cdef int table_load(Table* t, const char* buf, size_t length, uint64_t records,
                    const uint32_t* renumber, uint32_t renumber_len,
                    bint deletes, value_check valid) noexcept nogil:
    """Inserts `records` packed records from buf[0:length].  With a
    renumber map, each key's leading u32 (a rule number) is rewritten, and
    records of numbers mapped to UINT32_MAX are skipped (their rule is
    gone).  A record already present is replaced.  Records go in chunks:
    every slot and record a chunk needs is prefetched first, so the cache
    misses of a chunk overlap instead of coming one after another."""
    cdef size_t pos = 0, n, keylen, at[LOAD_CHUNK]
    cdef uint64_t k = 0, hashes[LOAD_CHUNK]
    cdef uint32_t num
    cdef int m, j, rc = FL_OK
    cdef char* copy = NULL
    cdef const char* rec
    while k < records and rc == FL_OK:
        m = 0
        while m < LOAD_CHUNK and k < records:
            if length - pos < WIRE_HEADER:
                rc = FL_EFORMAT
                break
            keylen = fl_get_u16(buf + pos + 4)
            n = wire_size(t, keylen)
            if n > length - pos or (renumber != NULL and keylen < 4):
                rc = FL_EFORMAT
                break
            if not (deletes and fl_get_u32(buf + pos) == 0) and not valid(
                    buf + pos + WIRE_HEADER, t.wire_value_size):
                rc = FL_ERANGE
                break
            at[m] = pos
            pos += n
            k += 1
            if renumber == NULL:
                hashes[m] = fl_siphash13(buf + at[m] + n - keylen, keylen, t.seed)
                prefetch_slot_or_record(t, hashes[m], False)
            m += 1
        if renumber == NULL:
            for j in range(m):
                prefetch_slot_or_record(t, hashes[j], True)
        for j in range(m):
            if rc != FL_OK:
                break
            rec = buf + at[j]
            keylen = fl_get_u16(rec + 4)
            if renumber == NULL:
                rc = load_record(t, rec, keylen, hashes[j], deletes)
                continue
            num = fl_get_u32(rec + WIRE_HEADER + t.wire_value_size) & RULE_NUMBER_MASK
            if num >= renumber_len or renumber[num] == UINT32_MAX:
                continue
            n = wire_size(t, keylen)
            copy = <char*>realloc(copy, n)
            if copy == NULL:
                return FL_ENOMEM
            memcpy(copy, rec, n)
            fl_put_u32(copy + WIRE_HEADER + t.wire_value_size, renumber[num] | (
                fl_get_u32(rec + WIRE_HEADER + t.wire_value_size) & ~RULE_NUMBER_MASK))
            rc = load_record(t, copy, keylen,
                             fl_siphash13(copy + WIRE_HEADER + t.wire_value_size, keylen,
                                          t.seed),
                             deletes)
    free(copy)
    if rc == FL_OK and pos != length:
        return FL_EFORMAT
    return rc


cdef int load_record(Table* t, const char* rec, size_t keylen, uint64_t h,
                     bint deletes) noexcept nogil:
    """Stores a record in its wire form (a tombstone deletes its key)."""
    cdef const char* key = rec + WIRE_HEADER + t.wire_value_size
    cdef uint32_t expire_s = fl_get_u32(rec)
    cdef const char* value = rec + WIRE_HEADER
    cdef char narrow[BUCKET_STORED_SIZE]
    cdef char* stored
    cdef Probe p
    cdef int rc = FL_OK
    if t.from_wire != NULL and not (deletes and expire_s == 0):
        invariant(t.value_size <= BUCKET_STORED_SIZE)
        t.from_wire(value, narrow)
        value = narrow
    # Every load is noted as a change: a primary importing moved slots has
    # its standbys take them (a snapshot loads before any replica, and a
    # replica keeps no log: nothing is noted there).
    if lookup_hashed(t, h, key, keylen, &p):
        if deletes and expire_s == 0:
            table_delete(t, &p)
        else:               # same key, same size: overwrite in place
            stored = probe_record(t, &p)
            fl_put_u32(stored, expire_s)
            memcpy(stored + RECORD_HEADER, value, t.value_size)
    elif deletes and expire_s == 0:
        return FL_OK
    else:
        rc = table_append(t, &p, key, keylen, expire_s, value)
    if rc == FL_OK:
        note_change(t, &p, key, keylen)
    return rc


# ---- change logs -------------------------------------------------------------------

cdef int changelog_append(ChangeLog* log, uint32_t shard, uint32_t hash,
                          const char* key, size_t keylen) noexcept nogil:
    cdef size_t n = NOTE_HEADER + keylen, cap
    cdef char* bigger
    if log.overflowed:
        return FL_ENOMEM
    if log.len == 0:
        log.first_ms = fl_wall_ms()
    if log.len + n > log.cap:
        cap = log.cap * 2 + n
        if log.len + n > log.limit:
            log.overflowed = True
            return FL_ENOMEM
        if cap > log.limit:
            cap = log.limit
        bigger = <char*>realloc(log.buf, cap)
        if bigger == NULL:
            log.overflowed = True
            return FL_ENOMEM
        log.buf = bigger
        log.cap = cap
    fl_put_u16(log.buf + log.len, <uint16_t>keylen)
    fl_put_u32(log.buf + log.len + 2, shard)
    fl_put_u32(log.buf + log.len + 6, hash)
    memcpy(log.buf + log.len + NOTE_HEADER, key, keylen)
    log.len += n
    return FL_OK


cdef int table_track(Table* t, size_t limit) noexcept nogil:
    """Starts (or restarts, emptied) the table's change log."""
    table_untrack(t)
    t.log = <ChangeLog*>calloc(1, sizeof(ChangeLog))
    if t.log == NULL:
        return FL_ENOMEM
    t.log.limit = limit
    return FL_OK


cdef void table_untrack(Table* t) noexcept nogil:
    if t.log != NULL:
        free(t.log.buf)
        free(t.log)
        t.log = NULL


cdef inline size_t pointer_hash(const char* p, size_t mask) noexcept nogil:
    return <size_t>(((<uint64_t><size_t>p) * <uint64_t>0x9E3779B97F4A7C15ULL) >> 32) & mask


cdef bint seen_before(const char** seen, size_t mask, const char* rec) noexcept nogil:
    """Adds rec to the open-addressing set; whether it was there."""
    cdef size_t i = pointer_hash(rec, mask)
    while seen[i] != NULL:
        if seen[i] == rec:
            return True
        i = (i + 1) & mask
    seen[i] = rec
    return False


cdef inline uint64_t noted_hash(const char* note) noexcept nogil:
    """The 64-bit hash a note stands for: shard bits high, slot hash low
    (see shard_of), so lookup_hashed finds the key without hashing it."""
    return (<uint64_t>fl_get_u32(note + 2) << 32) | fl_get_u32(note + 6)


cdef void table_prefetch(Table* t, const char* const* keys, const size_t* lens,
                         int n, uint64_t* hashes) noexcept nogil:
    cdef int j
    for j in range(n):
        hashes[j] = fl_siphash13(keys[j], lens[j], t.seed)
        prefetch_slot_or_record(t, hashes[j], False)
    for j in range(n):
        prefetch_slot_or_record(t, hashes[j], True)


cdef inline void prefetch_slot_or_record(Table* t, uint64_t h, bint record) noexcept nogil:
    """Requests the cache line of a hash's home slot, or of the record in
    that slot (after the slot's line arrived)."""
    cdef Shard* s = shard_of(t, h)
    cdef uint32_t i = home_slot(<uint32_t>h, s.nslots)
    if not record:
        fl_prefetch(&s.slots[i])
    elif s.slots[i].off != 0:
        fl_prefetch(s.arena + s.slots[i].off)


cdef int table_drain(Table* t, char** out, size_t* outlen,
                     uint64_t* records) noexcept nogil:
    cdef ChangeLog* log = t.log
    cdef size_t pos = 0, used = 0, cap, keylen, n, notes = 0, mask = 1
    cdef size_t at[LOAD_CHUNK]
    cdef int m, j
    cdef const char** seen
    cdef const char* note
    cdef char* buf
    cdef Probe p
    out[0] = NULL
    outlen[0] = 0
    records[0] = 0
    if log == NULL or log.len == 0:
        return FL_OK
    while pos < log.len:          # count the notes to size the set
        pos += NOTE_HEADER + fl_get_u16(log.buf + pos)
        notes += 1
    while mask < notes * 2:
        mask <<= 1
    seen = <const char**>calloc(mask, sizeof(char*))
    mask -= 1
    # Every note needs at most one record: header, value and key.
    cap = log.len + notes * (WIRE_HEADER + t.wire_value_size)
    buf = <char*>malloc(cap)
    if seen == NULL or buf == NULL:
        free(seen)
        free(buf)
        return FL_ENOMEM
    pos = 0
    while pos < log.len:
        # A chunk's slots, then its records, are requested before any is
        # read: the misses overlap (the notes are in write order, their
        # records anywhere in the table).
        m = 0
        while m < LOAD_CHUNK and pos < log.len:
            at[m] = pos
            prefetch_slot_or_record(t, noted_hash(log.buf + pos), False)
            pos += NOTE_HEADER + fl_get_u16(log.buf + pos)
            m += 1
        for j in range(m):
            prefetch_slot_or_record(t, noted_hash(log.buf + at[j]), True)
        for j in range(m):
            note = log.buf + at[j]
            keylen = fl_get_u16(note)
            if lookup_hashed(t, noted_hash(note), note + NOTE_HEADER, keylen, &p):
                if seen_before(seen, mask, probe_record(t, &p)):
                    continue
                n = record_to_wire(t, probe_record(t, &p), buf + used)
            else:                      # gone: a tombstone says so
                n = wire_size(t, keylen)
                memset(buf + used, 0, WIRE_HEADER + t.wire_value_size)
                fl_put_u16(buf + used + 4, <uint16_t>keylen)
                memcpy(buf + used + WIRE_HEADER + t.wire_value_size, note + NOTE_HEADER, keylen)
            used += n
            records[0] += 1
    free(seen)
    log.len = 0
    out[0] = buf
    outlen[0] = used
    return FL_OK


# ---- cluster slots ------------------------------------------------------------------

cdef int whole_key(const char* key, size_t keylen, const void* ctx,
                   const char** out, size_t* outlen) noexcept nogil:
    out[0] = key
    outlen[0] = keylen
    return 0


cdef int record_slot(const Table* t, const char* rec, route_key route,
                     const void* ctx) noexcept nogil:
    """The record's hash slot, or -1 when it has none."""
    cdef const char* key
    cdef size_t keylen
    if route(record_key(t, rec), record_keylen(t, rec), ctx, &key, &keylen) != 0:
        return -1
    return key_slot(key, keylen)


cdef inline bint unexpired(const char* rec, int64_t now_ms) noexcept nogil:
    return now_ms < <int64_t>fl_get_u32(rec) * 1000


cdef uint64_t table_count_slot(const Table* t, int slot, int64_t now_ms,
                               route_key route, const void* ctx) noexcept nogil:
    cdef uint64_t n = 0
    cdef uint32_t i, j
    cdef const Shard* s
    cdef const char* rec
    for i in range(t.nshards):
        s = &t.shards[i]
        for j in range(s.nslots):
            if s.slots[j].off != 0:
                rec = s.arena + s.slots[j].off
                if unexpired(rec, now_ms) and record_slot(t, rec, route, ctx) == slot:
                    n += 1
    return n


cdef int keylist_grow_set(KeyList* kl) noexcept nogil:
    """Doubles the dedup set (at half load), placing every key again."""
    cdef uint32_t cap = kl.setcap * 2 if kl.setcap else 64, i, j, off
    cdef uint32_t* fresh = <uint32_t*>calloc(cap, sizeof(uint32_t))
    if fresh == NULL:
        return FL_ENOMEM
    for i in range(kl.setcap):
        off = kl.set[i]
        if off != 0:
            j = <uint32_t>fl_siphash13(kl.buf + off + 1, fl_get_u16(kl.buf + off - 1),
                                       kl.seed) & (cap - 1)
            while fresh[j] != 0:
                j = (j + 1) & (cap - 1)
            fresh[j] = off
    free(kl.set)
    kl.set = fresh
    kl.setcap = cap
    return FL_OK


cdef int keylist_add(KeyList* kl, const char* key, size_t n) noexcept nogil:
    """Adds key unless the list has it or is full."""
    cdef uint32_t i, off
    cdef size_t cap
    cdef char* bigger
    if kl.count >= kl.limit:
        return FL_OK
    if (<uint64_t>kl.count + 1) * 2 > kl.setcap and keylist_grow_set(kl) != FL_OK:
        return FL_ENOMEM
    i = <uint32_t>fl_siphash13(key, n, kl.seed) & (kl.setcap - 1)
    while kl.set[i] != 0:
        off = kl.set[i] - 1
        if fl_get_u16(kl.buf + off) == n and memcmp(kl.buf + off + 2, key, n) == 0:
            return FL_OK
        i = (i + 1) & (kl.setcap - 1)
    if kl.len + 2 + n > kl.cap:
        cap = kl.cap * 2 + 2 + n
        if cap >= UINT32_MAX:
            kl.limit = kl.count     # offsets are u32: the reply stops here
            return FL_OK
        bigger = <char*>realloc(kl.buf, cap)
        if bigger == NULL:
            return FL_ENOMEM
        kl.buf = bigger
        kl.cap = cap
    fl_put_u16(kl.buf + kl.len, <uint16_t>n)
    memcpy(kl.buf + kl.len + 2, key, n)
    kl.set[i] = <uint32_t>kl.len + 1
    kl.len += 2 + n
    kl.count += 1
    return FL_OK


cdef int table_slot_keys(Table* t, int slot, int64_t now_ms, route_key route,
                         const void* ctx, KeyList* out) noexcept nogil:
    cdef uint32_t i, j
    cdef const Shard* s
    cdef const char* rec
    cdef const char* key
    cdef size_t keylen
    for i in range(t.nshards):
        s = &t.shards[i]
        for j in range(s.nslots):
            if out.count >= out.limit:
                return FL_OK
            if s.slots[j].off == 0:
                continue
            rec = s.arena + s.slots[j].off
            if not unexpired(rec, now_ms) or route(
                    record_key(t, rec), record_keylen(t, rec), ctx, &key, &keylen) != 0:
                continue
            if key_slot(key, keylen) == slot and keylist_add(out, key, keylen) != FL_OK:
                return FL_ENOMEM
    return FL_OK


cdef bint live_at(Table* t, Shard* s, size_t pos, Probe* p) noexcept nogil:
    """Whether the arena record at pos is the key's current record (the
    arena also holds deleted ones)."""
    cdef const char* rec = s.arena + pos
    cdef size_t keylen = record_keylen(t, rec)
    # Not table_lookup: one more caller and the compiler stops inlining it
    # into bucket_check (7 more instructions per CL.CHECK, callgrind).
    return (lookup_hashed(t, fl_siphash13(record_key(t, rec), keylen, t.seed),
                          record_key(t, rec), keylen, p)
            and p.shard == s and s.slots[p.slot].off == pos)


cdef int walk_arenas(Table* t, const unsigned char* mask, route_key route,
                     const void* ctx, ArenaCursor* cur, int64_t deadline_ns,
                     size_t max_bytes, bint delete, char** out, size_t* outlen,
                     uint64_t* count) noexcept nogil:
    """table_export's and table_delete_slots' walk: from the cursor, every
    live record whose slot is in mask is copied to out[0] (grown with
    realloc) or deleted, until the walk ends (cur.done), the deadline
    passes or max_bytes are copied."""
    cdef Shard* s
    cdef char* rec
    cdef char* bigger
    cdef size_t n, cap = 0
    cdef uint64_t visited = 0
    cdef int slot
    cdef Probe p
    if cur.relocations != t.relocations:
        cur.pos = 0           # records moved: this shard again from its start
        cur.relocations = t.relocations
    while cur.shard < t.nshards:
        s = &t.shards[cur.shard]
        if cur.pos == 0:
            cur.pos = ARENA_START
            cur.end = s.arena_len
        while cur.pos < cur.end:
            visited += 1
            if (visited % SWEEP_CHECK_EVERY == 0 and fl_mono_ns() > deadline_ns) or (
                    not delete and outlen[0] >= max_bytes):
                return FL_OK
            rec = s.arena + cur.pos
            n = record_size(t, rec)
            slot = record_slot(t, rec, route, ctx)
            if slot >= 0 and mask[slot] and live_at(t, s, cur.pos, &p):
                if delete:
                    table_delete(t, &p)
                    note_change(t, &p, record_key(t, rec), record_keylen(t, rec))
                else:
                    if outlen[0] + wire_size(t, record_keylen(t, rec)) > cap:
                        cap = cap * 2 + wire_size(t, record_keylen(t, rec)) + 4096
                        bigger = <char*>realloc(out[0], cap)
                        if bigger == NULL:
                            return FL_ENOMEM
                        out[0] = bigger
                    outlen[0] += record_to_wire(t, rec, out[0] + outlen[0])
                count[0] += 1
            cur.pos += n
        cur.shard += 1
        cur.pos = 0
    cur.done = True
    return FL_OK


cdef int table_export(Table* t, const unsigned char* mask, route_key route,
                      const void* ctx, ArenaCursor* cur, int64_t deadline_ns,
                      size_t max_bytes, char** out, size_t* outlen,
                      uint64_t* records) noexcept nogil:
    out[0] = NULL
    outlen[0] = 0
    records[0] = 0
    return walk_arenas(t, mask, route, ctx, cur, deadline_ns, max_bytes, False,
                       out, outlen, records)


cdef int table_delete_slots(Table* t, const unsigned char* mask, route_key route,
                            const void* ctx, ArenaCursor* cur, int64_t deadline_ns,
                            uint64_t* deleted) noexcept nogil:
    cdef size_t unused = 0
    deleted[0] = 0
    return walk_arenas(t, mask, route, ctx, cur, deadline_ns, 0, True, NULL, &unused,
                       deleted)


# ---- token bucket ---------------------------------------------------------------

cdef const char* bucket_params_error(const BucketParams* bp) noexcept nogil:
    if bp.capacity < 1 or bp.capacity > MAX_CAPACITY:
        return b"capacity must be an integer from 1 to 10^15"
    if bp.refill < 1 or bp.refill > MAX_REFILL:
        return b"refill_per_sec must be an integer from 1 to 10^15"
    if bp.period_ms < 1 or bp.period_ms > MAX_PERIOD_MS:
        return b"PERIOD must be an integer from 1 to 4294967295 ms"
    if bp.cost < 0 or bp.cost > MAX_CAPACITY:
        return b"COST must be an integer from 0 to 10^15"
    # Refilling a whole bucket must take a representable time.
    if <fl_i128>bp.capacity * bp.period_ms > <fl_i128>MAX_REFILL_TIME_MS * bp.refill:
        return b"rate too slow: refilling the bucket would take more than 10^15 ms"
    return NULL


cdef inline uint32_t fraction_from_remainder(uint32_t rem, int64_t period_ms) noexcept nogil:
    """The refill remainder (rem/period_ms of a milli-token) as a fraction
    of a milli-token in units of 2^-32, rounded up, so that it means the
    same under any PERIOD a later call may use.  Below 2^32 because
    rem < period_ms <= 2^32 - 1."""
    return <uint32_t>(((<uint64_t>rem << 32) + <uint64_t>period_ms - 1) // <uint64_t>period_ms)


cdef inline uint32_t remainder_from_fraction(uint32_t frac, int64_t period_ms) noexcept nogil:
    """Inverse of fraction_from_remainder, rounding down: exact when the
    PERIOD is unchanged (the error of the rounding up is below one unit
    because period_ms < 2^32), and at most one 1/period_ms of a
    milli-token off when it changed."""
    cdef uint64_t rem = (<uint64_t>frac * <uint64_t>period_ms) >> 32
    return <uint32_t>(rem if rem < <uint64_t>period_ms else period_ms - 1)


cdef inline int64_t ms_until(int64_t tokens, uint32_t rem, int64_t target,
                             const BucketParams* bp) noexcept nogil:
    """Milliseconds of refill until `tokens` (milli-tokens, plus `rem`
    1/period_ms-ths of one) reaches `target`, rounded up."""
    cdef fl_i128 need = (<fl_i128>(target - tokens)) * bp.period_ms - rem
    cdef fl_i128 per_ms = <fl_i128>bp.refill * 1000
    if need <= 0:
        return 0
    return <int64_t>((need + per_ms - 1) // per_ms)


cdef int bucket_check(Table* t, const char* key, size_t keylen, uint64_t h,
                      const BucketParams* bp, int64_t now_ms, bint commit,
                      CheckResult* out) noexcept nogil:
    """One check of the reference token bucket (see the brief), with
    integer milli-tokens.  A bucket that ends full is not stored: a full
    bucket is indistinguishable from no bucket.  Without `commit` nothing
    is spent or stored and the reply describes the bucket as it stands
    (the first phase of an all-or-nothing check of several rules).

    A peek (cost 0) never writes either.  A record's expiry is when it
    is full under the parameters of the call that wrote it, and from then
    on every call reads it as full, swept or not; a write under other
    parameters moves the expiry, a peek must not, or whether a bucket
    jumped to full would depend on whether some peek happened to come by.

    Bounds (fl_native.h), so that every value is exact: tokens and cost_m
    <= cap_m <= 10^18 (a loaded value is range-checked the same way);
    elapsed <= MAX_NOW_MS = 4e12 (a loaded last is in 0..MAX_NOW_MS), so
    elapsed * refill * 1000 + rem <= 4e12 * 1e15 * 1e3 + 2^32 < 2^127;
    add is compared with cap_m - tokens before it becomes an i64; a
    PERIOD change converts the remainder through a 2^-32 fraction (u64
    maths, below), so no rescaled value exceeds period_ms < 2^32; and
    ms_until is at most the time to refill a whole bucket, <=
    MAX_REFILL_TIME_MS = 10^15 (bucket_params_error)."""
    cdef Probe p
    cdef int64_t cap_m = bp.capacity * 1000
    cdef int64_t cost_m = bp.cost * 1000
    cdef int64_t tokens = cap_m, last = now_ms, elapsed, expire_ms
    cdef uint32_t rem = 0
    cdef fl_i128 num, add
    cdef char* v
    cdef char value[BUCKET_STORED_SIZE]
    cdef int rc

    if keylen > FL_MAX_KEY_LEN:
        return FL_EKEYLEN
    if h == 0:      # unknown (a hash that is 0 is found again: the same)
        h = fl_siphash13(key, keylen, t.seed)
    lookup_hashed(t, h, key, keylen, &p)
    if record_live(t, &p, now_ms):
        v = probe_value(t, &p)
        tokens = bucket_tokens(v)
        last = bucket_last(v)
        rem = remainder_from_fraction(bucket_fraction(v), bp.period_ms)
        if tokens >= cap_m:     # parameters changed: cap, never mint
            tokens = cap_m
            rem = 0

    elapsed = now_ms - last
    if elapsed > 0 and tokens < cap_m:
        num = <fl_i128>elapsed * bp.refill * 1000 + rem
        add = num // bp.period_ms
        if add >= cap_m - tokens:
            tokens = cap_m
            rem = 0
        else:
            tokens += <int64_t>add
            rem = <uint32_t>(num % bp.period_ms)
    last = now_ms

    out.limit = bp.capacity
    if bp.cost > bp.capacity:
        out.allowed = 0
        out.retry_after_ms = -1
    elif tokens >= cost_m:
        out.allowed = 1
        out.retry_after_ms = 0
        if commit:
            tokens -= cost_m
    else:
        out.allowed = 0
        out.retry_after_ms = ms_until(tokens, rem, cost_m, bp)
    out.remaining = tokens // 1000
    out.reset_after_ms = ms_until(tokens, rem, cap_m, bp)
    invariant(0 <= tokens <= cap_m and rem < bp.period_ms)
    invariant(out.reset_after_ms >= 0 and out.retry_after_ms >= -1)

    if not commit or bp.cost == 0:
        return FL_OK
    if tokens == cap_m:
        if p.found:
            table_delete(t, &p)
            note_change(t, &p, key, keylen)
        return FL_OK
    expire_ms = now_ms + out.reset_after_ms
    bucket_put(value, tokens, last, fraction_from_remainder(rem, bp.period_ms))
    if p.found:
        v = probe_record(t, &p)
        fl_put_u32(v, expire_second(expire_ms))
        memcpy(v + RECORD_HEADER, value, BUCKET_STORED_SIZE)
        note_change(t, &p, key, keylen)
        return FL_OK
    rc = table_insert(t, &p, key, keylen, expire_second(expire_ms), value, now_ms)
    if rc == FL_OK:
        note_change(t, &p, key, keylen)
    return rc


cdef bint in_range(int64_t v, int64_t low, int64_t high) noexcept nogil:
    return low <= v <= high


cdef bint bucket_value_ok(const char* v, uint32_t value_size) noexcept nogil:
    """Tokens as a check stores them (0..capacity in milli-tokens) and a
    time the clock can show; any fraction is a valid u32."""
    return (value_size == BUCKET_VALUE_SIZE
            and in_range(fl_get_i64(v), 0, MAX_CAPACITY * 1000)
            and in_range(fl_get_i64(v + 8), 0, MAX_NOW_MS))


cdef uint32_t expire_second(int64_t ms) noexcept nogil:
    """The record's expiry, rounded up to a second.  Refills that end past
    2^32 - 1 seconds (year 2106) store UINT32_MAX: never dropped unless
    touched, which the clock bound (MAX_NOW_MS) keeps unreachable."""
    cdef int64_t s = (ms + 999) // 1000
    return UINT32_MAX if s >= UINT32_MAX else <uint32_t>s


cdef int bucket_reset(Table* t, const char* key, size_t keylen) noexcept nogil:
    cdef Probe p
    if not table_lookup(t, key, keylen, &p):
        return 0
    table_delete(t, &p)
    note_change(t, &p, key, keylen)
    return 1


# ---- Python-facing objects -------------------------------------------------------

@cython.freelist(256)
cdef class Decision:
    """One check's outcome, in the units of ``CL.CHECK``'s reply.

    ``limit`` is the bucket's capacity; ``remaining`` the whole tokens left
    after this call; ``retry_after_ms`` 0 when allowed, else how long until
    the cost would pass (-1: it never can, the cost exceeds the capacity);
    ``reset_after_ms`` how long until the bucket is full again; ``source``
    who answered (see fastlimit.decision).  Immutable; built in C by the
    embedded limiter, where a Python-level object would cost more than the
    check itself.
    """

    def __init__(self, bint allowed, int64_t limit, int64_t remaining,
                 int64_t retry_after_ms, int64_t reset_after_ms, str source="server"):
        self.allowed = allowed
        self.limit = limit
        self.remaining = remaining
        self.retry_after_ms = retry_after_ms
        self.reset_after_ms = reset_after_ms
        self.source = source

    @classmethod
    def from_reply(cls, reply, str source="server"):
        """From the five integers of a CL.CHECK / CL.LIMIT reply; TypeError
        or ValueError if it is not that."""
        allowed, limit, remaining, retry_after_ms, reset_after_ms = reply
        return cls(bool(allowed), int(limit), int(remaining), int(retry_after_ms),
                   int(reset_after_ms), source)

    def replace(self, **changes):
        """A copy with some fields changed."""
        fields = dict(zip(DECISION_FIELDS, self.as_tuple()))
        fields.update(changes)
        return Decision(**fields)

    def as_tuple(self):
        return (self.allowed, self.limit, self.remaining, self.retry_after_ms,
                self.reset_after_ms, self.source)

    def __eq__(self, other):
        if not isinstance(other, Decision):
            return NotImplemented
        return self.as_tuple() == (<Decision>other).as_tuple()

    def __hash__(self):
        return hash(self.as_tuple())

    def __repr__(self):
        return "Decision(" + ", ".join(
            f"{name}={value!r}" for name, value in zip(DECISION_FIELDS, self.as_tuple())) + ")"

    def __reduce__(self):
        return Decision, self.as_tuple()


DECISION_FIELDS = ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "source")


cdef inline Decision new_decision(const CheckResult* r, str source):
    cdef Decision d = Decision.__new__(Decision)
    d.allowed = r.allowed == 1
    d.limit = r.limit
    d.remaining = r.remaining
    d.retry_after_ms = r.retry_after_ms
    d.reset_after_ms = r.reset_after_ms
    d.source = source
    return d


cdef class Clock:
    def __init__(self, bint manual=False, int64_t start_ms=0):
        self.manual = manual
        self.manual_ms = start_ms

    cdef int64_t now_ms(self) noexcept:
        return self.manual_ms if self.manual else fl_wall_ms()

    def now(self):
        """Server time in integer milliseconds."""
        return self.now_ms()

    def set(self, int64_t ms):
        self._require_manual()
        if ms < 0 or ms > MAX_NOW_MS:
            raise ValueError("clock value out of range")
        self.manual_ms = ms

    def advance(self, int64_t ms):
        self._require_manual()
        if ms < 0 or self.manual_ms + ms > MAX_NOW_MS:
            raise ValueError("clock advance out of range")
        self.manual_ms += ms

    def _require_manual(self):
        if not self.manual:
            raise RuntimeError("the clock is not manual")


POLICIES = {"noeviction": EVICT_NONE, "nearest-full": EVICT_NEAREST_FULL,
            "allkeys-random": EVICT_RANDOM}


cdef class MemoryBound:
    """maxmemory over the tables of the stores attached to it: a new
    bucket that would take the tables past `limit` bytes first evicts
    (policy nearest-full or allkeys-random, `samples` records looked at
    per eviction) or is refused (noeviction).  A store attaches with
    set_bound(bound) and detaches with set_bound(None): with no bound a
    table pays nothing."""

    def __cinit__(self):
        memset(&self.b, 0, sizeof(MemBound))
        self.b.samples = 5
        self.b.rng = int.from_bytes(os.urandom(8), "little") | 1
        self.b.policy = EVICT_NEAREST_FULL

    def __dealloc__(self):
        while self.b.tables != NULL:
            bound_detach(self.b.tables)

    def configure(self, size_t limit, str policy, uint32_t samples):
        """ValueError for a policy it does not know or samples out of 1..64."""
        if policy not in POLICIES:
            raise ValueError(f"unknown maxmemory-policy {policy!r}")
        if not 1 <= samples <= 64:
            raise ValueError("maxmemory-samples must be from 1 to 64")
        self.b.limit = limit
        self.b.policy = POLICIES[policy]
        self.b.samples = samples

    def evict(self, int64_t now_ms, double budget_ms=1.0):
        """Brings the tables back under the limit (after it was lowered),
        for at most budget_ms, ranking records as they stand at now_ms
        (server time); returns how many records were evicted."""
        cdef uint64_t before = self.b.evicted
        cdef int64_t deadline = fl_mono_ns() + <int64_t>(budget_ms * 1e6)
        if self.b.limit and self.b.used > self.b.limit:
            bound_reclaim(&self.b, 0, 1 << 30, deadline, now_ms)
        return self.b.evicted - before

    @property
    def limit(self):
        return self.b.limit

    @property
    def used(self):
        """Bytes of the attached tables: what is compared with the limit."""
        return self.b.used

    @property
    def evicted(self):
        return self.b.evicted


cdef void set_table_bound(Table* t, MemoryBound bound) noexcept:
    if bound is None:
        bound_detach(t)
    else:
        bound_attach(&bound.b, t)


cdef class BucketStore:
    def __cinit__(self, uint32_t shards=256, Clock clock=None, bytes seed=None):
        if shards == 0 or shards & (shards - 1) or shards > 65536:
            raise ValueError("shards must be a power of two from 1 to 65536")
        if seed is None:
            seed = os.urandom(16)
        if len(seed) != 16:
            raise ValueError("seed must be 16 bytes")
        self.clock = clock if clock is not None else Clock()
        if bucket_table_init(&self.table, shards, <const uint8_t*><const char*>seed) != FL_OK:
            raise MemoryError()
        self.table.spent = bucket_spent

    def __dealloc__(self):
        table_free(&self.table)

    cdef int check_c(self, const char* key, size_t keylen,
                     const BucketParams* bp, int64_t now_ms,
                     CheckResult* out) noexcept:
        return bucket_check(&self.table, key, keylen, 0, bp, now_ms, True, out)

    def check(self, bytes key, int64_t capacity, int64_t refill_per_sec,
              int64_t cost=1, int64_t period_ms=1000, now_ms=None):
        """Returns (allowed, limit, remaining, retry_after_ms, reset_after_ms)."""
        cdef CheckResult r
        self.checked(key, capacity, refill_per_sec, cost, period_ms, now_ms, &r)
        return (r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms)

    def decide(self, bytes key, int64_t capacity, int64_t refill_per_sec,
               int64_t cost=1, int64_t period_ms=1000, str source="local"):
        """check(), answered as a Decision."""
        cdef CheckResult r
        self.checked(key, capacity, refill_per_sec, cost, period_ms, None, &r)
        return new_decision(&r, source)

    cdef int checked(self, bytes key, int64_t capacity, int64_t refill_per_sec,
                     int64_t cost, int64_t period_ms, now_ms, CheckResult* out) except -1:
        """Validates, then checks; raises ValueError or MemoryError."""
        cdef BucketParams bp
        cdef const char* err
        cdef int rc
        bp.capacity = capacity
        bp.refill = refill_per_sec
        bp.period_ms = period_ms
        bp.cost = cost
        err = bucket_params_error(&bp)
        if err != NULL:
            raise ValueError(err.decode())
        if now_ms is not None and not 0 <= now_ms <= MAX_NOW_MS:
            raise ValueError("now_ms out of range: 0 to 4*10^12")
        rc = self.check_c(key, len(key), &bp,
                          self.clock.now_ms() if now_ms is None else now_ms, out)
        if rc == FL_EKEYLEN:
            raise ValueError("key longer than 65535 bytes")
        if rc != FL_OK:
            raise_for(rc)
        return 0

    def set_bound(self, MemoryBound bound):
        """Puts the table under a memory bound, or none (None)."""
        set_table_bound(&self.table, bound)

    def reset(self, bytes key):
        """Forgets a bucket; True if there was one."""
        return bucket_reset(&self.table, key, len(key)) == 1

    def clear(self):
        if table_clear(&self.table) != FL_OK:
            raise MemoryError()

    def sweep(self, now_ms=None, double budget_ms=1.0):
        """Drops buckets that have refilled, for at most `budget_ms`.
        Returns (removed, slots_scanned)."""
        cdef uint64_t scanned = 0, removed
        cdef int64_t now = self.clock.now_ms() if now_ms is None else now_ms
        removed = table_sweep(&self.table, expire_second(now - 999),
                              fl_mono_ns() + <int64_t>(budget_ms * 1e6), &scanned)
        return removed, scanned

    def dump(self, int fd, uint32_t crc=0):
        """Writes the buckets to fd as one snapshot section named "check";
        returns the CRC-32 chained from crc."""
        return dump_section(&self.table, fd, crc, b"check")

    def load(self, const unsigned char[:] data, uint64_t records, bint deletes=False):
        """Adds `records` buckets from a dump (or a drain, whose tombstones
        remove buckets when `deletes`); ValueError if malformed."""
        load_table(&self.table, data, records, None, bucket_value_ok, deletes)

    def track_changes(self, size_t limit):
        """Starts noting written keys (see ChangeLog), emptying what was
        noted; limit is the log's size in bytes."""
        if table_track(&self.table, limit) != FL_OK:
            raise MemoryError()

    def untrack_changes(self):
        table_untrack(&self.table)

    def changes_overflowed(self):
        return log_overflowed(&self.table)

    def oldest_change_ms(self):
        """Wall time of the oldest change not drained yet, or None."""
        return oldest_note(&self.table)

    def drain_changes(self):
        """The noted keys' states as a snapshot section, in parts (header,
        records) to be joined once into a batch; [] when nothing changed."""
        return drain_section(&self.table, b"check")

    # ---- cluster slots (CLUSTER COUNTKEYSINSLOT/GETKEYSINSLOT, slot moves) ----

    cdef list slot_tables(self):
        return [(b"check", <size_t>&self.table, False)]

    def count_in_slot(self, int slot, now_ms=None):
        """Live buckets of a hash slot (a scan of the whole table)."""
        return count_in_slot(self.slot_tables(), NULL, NULL, checked_slot(slot),
                             self.clock.now_ms() if now_ms is None else now_ms)

    def keys_in_slot(self, SlotKeys keys, int slot, now_ms=None):
        """Adds the keys of a slot's live buckets to `keys`."""
        keys_in_slot(self.slot_tables(), NULL, NULL, checked_slot(slot),
                     self.clock.now_ms() if now_ms is None else now_ms, keys)

    def export_slots(self, SlotCursor cursor, double budget_ms=1.0,
                     size_t max_bytes=1 << 20):
        """The next buckets of the cursor's slots as snapshot sections
        (load them with load()), within budget_ms and about max_bytes;
        cursor.done once all are out."""
        return walk_slots(self.slot_tables(), NULL, NULL, cursor, budget_ms, max_bytes,
                          False)

    def delete_slots(self, SlotCursor cursor, double budget_ms=1.0):
        """Deletes the next buckets of the cursor's slots within
        budget_ms; returns how many."""
        return walk_slots(self.slot_tables(), NULL, NULL, cursor, budget_ms, 0, True)

    def filter_section(self, bytes mask, bytes name, uint32_t value_size,
                       const unsigned char[:] data, uint64_t records):
        """A drained "check" section's records in mask's slots, as a
        section ([] when none)."""
        return filter_section(name, value_size, data, records, mask, whole_key, NULL)

    def __len__(self):
        return table_count(&self.table)

    @property
    def memory_bytes(self):
        return table_memory(&self.table)

    @property
    def expired_total(self):
        return self.table.expired

    @property
    def shards(self):
        return self.table.nshards


cdef class SlotKeys:
    def __cinit__(self, uint64_t limit):
        memset(&self.kl, 0, sizeof(KeyList))
        self.kl.limit = <uint32_t>min(limit, UINT32_MAX - 1)
        cdef bytes seed = os.urandom(16)    # keys come from clients: a keyed hash
        memcpy(self.kl.seed, <const char*>seed, 16)

    def __dealloc__(self):
        free(self.kl.buf)
        free(self.kl.set)

    def keys(self):
        """The keys gathered, in the order found."""
        cdef size_t pos = 0, n
        found = []
        while pos < self.kl.len:
            n = fl_get_u16(self.kl.buf + pos)
            found.append(self.kl.buf[pos + 2:pos + 2 + n])
            pos += 2 + n
        return found


cdef class SlotCursor:
    def __cinit__(self, bytes mask not None):
        if len(mask) != CLUSTER_SLOTS:
            raise ValueError(f"a slot mask has {CLUSTER_SLOTS} bytes")
        memcpy(self.mask, <const char*>mask, CLUSTER_SLOTS)
        memset(&self.arena, 0, sizeof(ArenaCursor))
        self.table = None
        self.finished = set()
        self.records = 0

    @property
    def done(self):
        """Set by the walk that found no table left to walk."""
        return None in self.finished


def checked_slot(int slot):
    if not 0 <= slot < CLUSTER_SLOTS:
        raise ValueError("slot out of range")
    return slot


cdef inline route_key route_of(bint by_rule, route_key rule_route) noexcept:
    return rule_route if by_rule else whole_key


cdef uint64_t count_in_slot(list named, route_key rule_route, const void* ctx,
                            int slot, int64_t now_ms) except? 0:
    cdef uint64_t n = 0
    for _, address, by_rule in named:
        n += table_count_slot(<Table*><size_t>address, slot, now_ms,
                              route_of(by_rule, rule_route), ctx)
    return n


cdef int keys_in_slot(list named, route_key rule_route, const void* ctx, int slot,
                      int64_t now_ms, SlotKeys keys) except -1:
    for _, address, by_rule in named:
        if table_slot_keys(<Table*><size_t>address, slot, now_ms,
                           route_of(by_rule, rule_route), ctx, &keys.kl) != FL_OK:
            raise MemoryError()
    return 0


cdef int filter_records(uint32_t value_size, const char* buf, size_t length,
                        uint64_t records, const unsigned char* mask, route_key route,
                        const void* ctx, char* out, size_t* outlen,
                        uint64_t* kept) noexcept nogil:
    """Copies the records of buf whose slot is in mask to out (as long as
    buf); FL_EFORMAT if the records do not fit their section."""
    cdef size_t pos = 0, n, keylen
    cdef uint64_t k
    cdef const char* key
    cdef size_t routed_len
    for k in range(records):
        if length - pos < WIRE_HEADER:
            return FL_EFORMAT
        keylen = fl_get_u16(buf + pos + 4)
        n = WIRE_HEADER + value_size + keylen
        if n > length - pos:
            return FL_EFORMAT
        if route(buf + pos + WIRE_HEADER + value_size, keylen, ctx, &key,
                 &routed_len) == 0 and mask[key_slot(key, routed_len)]:
            memcpy(out + outlen[0], buf + pos, n)
            outlen[0] += n
            kept[0] += 1
        pos += n
    return FL_OK if pos == length else FL_EFORMAT


cdef list filter_section(bytes name, uint32_t value_size, const unsigned char[:] data,
                         uint64_t records, bytes mask, route_key route, const void* ctx):
    cdef size_t n = data.shape[0], used = 0
    cdef uint64_t kept = 0
    cdef char* out
    cdef int rc
    if len(mask) != CLUSTER_SLOTS:
        raise ValueError(f"a slot mask has {CLUSTER_SLOTS} bytes")
    if n == 0:
        return []
    out = <char*>malloc(n)
    if out == NULL:
        raise MemoryError()
    try:
        rc = filter_records(value_size, <const char*>&data[0], n, records,
                            <const unsigned char*><const char*>mask, route, ctx, out,
                            &used, &kept)
        if rc != FL_OK:
            raise ValueError("malformed bucket records")
        if kept == 0:
            return []
        return [section_header(name, value_size, kept, used), out[:used]]
    finally:
        free(out)


cdef object walk_slots(list named, route_key rule_route, const void* ctx,
                       SlotCursor cursor, double budget_ms, size_t max_bytes, bint delete):
    """One budgeted step of an export (a list of snapshot sections, see
    dump_section) or a deletion (the count deleted) of the records in the
    cursor's slots, over the named tables in order, from where the last
    step stopped.  cursor.done once every table is walked."""
    cdef int64_t deadline = fl_mono_ns() + <int64_t>(budget_ms * 1e6)
    cdef Table* t
    cdef char* buf = NULL
    cdef size_t n = 0
    cdef uint64_t count = 0, total = 0
    cdef int rc
    sections = []
    for name, address, by_rule in named:
        if name in cursor.finished:
            continue
        if cursor.table != name:
            cursor.table = name
            memset(&cursor.arena, 0, sizeof(ArenaCursor))
            cursor.arena.relocations = (<Table*><size_t>address).relocations
        t = <Table*><size_t>address
        if delete:
            rc = table_delete_slots(t, cursor.mask, route_of(by_rule, rule_route), ctx,
                                    &cursor.arena, deadline, &count)
        else:
            rc = table_export(t, cursor.mask, route_of(by_rule, rule_route), ctx,
                              &cursor.arena, deadline, max_bytes - min(max_bytes, total),
                              &buf, &n, &count)
        try:
            if rc != FL_OK:
                raise MemoryError()
            if count and not delete:
                sections += [section_header(name, t.wire_value_size, count, n), buf[:n]]
        finally:
            free(buf)
            buf = NULL
        total += count if delete else n
        cursor.records += count
        if not cursor.arena.done:
            return total if delete else sections
        cursor.finished.add(name)
    cursor.table = None
    cursor.finished.add(None)     # nothing left: done
    return total if delete else sections


cdef size_t table_live_bytes(const Table* t) noexcept nogil:
    """Bytes of the live records in their wire form, as table_dump writes
    them: the arena's, with each record's header and value widened, and
    the u16 length a long key keeps before it left out."""
    cdef size_t n = 0
    cdef uint64_t count = table_count(t)
    cdef uint32_t i
    for i in range(t.nshards):
        n += t.shards[i].arena_len - ARENA_START - t.shards[i].dead
    return (n + count * (WIRE_HEADER - RECORD_HEADER + t.wire_value_size - t.value_size)
            - 2 * t.long_keys)


cdef uint32_t dump_section(const Table* t, int fd, uint32_t crc, bytes name) except? 0:
    """A snapshot section: <u16 name length><name><u32 value size><u64
    records><u64 bytes>, then the records.  Returns the chained CRC."""
    cdef bytes header = section_header(name, t.wire_value_size, table_count(t),
                                       table_live_bytes(t))
    if write_all(fd, header, len(header), &crc) != FL_OK:
        raise OSError(errno, "writing the snapshot failed")
    records, crc = dump_table(t, fd, crc)
    invariant(records == table_count(t))
    return crc


cdef object dump_table(const Table* t, int fd, uint32_t crc):
    """(records, crc) of table_dump, raising OSError on a failed write."""
    cdef uint64_t records = 0
    cdef int rc
    with nogil:
        rc = table_dump(t, fd, &crc, &records)
    if rc == FL_EIO:
        raise OSError(errno, "writing the snapshot failed")
    if rc != FL_OK:
        raise MemoryError()
    return records, crc


cdef int load_table(Table* t, const unsigned char[:] data, uint64_t records,
                    list renumber, value_check valid, bint deletes=False) except -1:
    """table_load over a buffer, with an optional renumbering list."""
    cdef uint32_t* table_map = NULL
    cdef uint32_t map_len = 0, i
    cdef int rc
    cdef const char* buf = NULL
    if data.shape[0] == 0:
        if records:
            raise ValueError("malformed bucket records")
        return 0
    buf = <const char*>&data[0]
    if renumber is not None:
        map_len = len(renumber)
        table_map = <uint32_t*>malloc(max(map_len, 1) * sizeof(uint32_t))
        if table_map == NULL:
            raise MemoryError()
        for i in range(map_len):
            table_map[i] = UINT32_MAX if renumber[i] is None else renumber[i]
    try:
        rc = table_load(t, buf, data.shape[0], records, table_map, map_len, deletes, valid)
    finally:
        free(table_map)
    if rc == FL_EFORMAT:
        raise ValueError("malformed bucket records")
    if rc == FL_ERANGE:
        raise ValueError("a bucket's value is out of range")
    if rc != FL_OK:
        raise MemoryError()
    return 0


cdef bytes section_header(bytes name, uint32_t value_size, uint64_t records, uint64_t nbytes):
    return struct.pack("<H", len(name)) + name + struct.pack("<IQQ", value_size, records, nbytes)


cdef list drain_section(Table* t, bytes name):
    """table_drain's records as a snapshot section (see dump_section): its
    header and its records, or [] when nothing was noted."""
    cdef char* buf = NULL
    cdef size_t n = 0
    cdef uint64_t records = 0
    if table_drain(t, &buf, &n, &records) != FL_OK:
        raise MemoryError()
    try:
        if records == 0:
            return []
        return [section_header(name, t.wire_value_size, records, n), buf[:n]]
    finally:
        free(buf)


cdef bint log_overflowed(const Table* t) noexcept:
    return t.log != NULL and t.log.overflowed


cdef object oldest_note(const Table* t):
    if t.log == NULL or t.log.len == 0:
        return None
    return t.log.first_ms
