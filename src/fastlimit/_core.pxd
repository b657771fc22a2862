# The engine's contract: sharded open-addressing tables of packed records
# and the token-bucket arithmetic on top of them.  Nothing here touches
# Python objects on the hot path and nothing raises: every C-level
# function reports failure through its return value.

from libc.stdint cimport int64_t, uint64_t, uint32_t, uint16_t, uint8_t

cdef extern from "<assert.h>":
    # C assert: compiled in by the debug build (FASTLIMIT_DEBUG=1), where a
    # broken invariant aborts the process and fails the test that caused it.
    void invariant "assert"(bint condition) nogil

cdef extern from "fl_native.h":
    # __int128 in C; Cython only needs to know it is an integer
    ctypedef long long fl_i128
    uint64_t fl_siphash13(const void* data, size_t length, const uint8_t* key16) nogil
    void* fl_big_realloc(void* p, size_t old_size, size_t new_size) nogil
    void fl_big_free(void* p, size_t size) nogil
    void* fl_mem_alloc(size_t size) nogil
    void* fl_mem_realloc(void* p, size_t old_size, size_t new_size) nogil
    void fl_mem_free(void* p, size_t size) nogil
    int64_t fl_wall_ms() nogil
    int64_t fl_mono_ns() nogil
    int64_t fl_get_i64(const char* p) nogil
    void fl_put_i64(char* p, int64_t v) nogil
    uint32_t fl_get_u32(const char* p) nogil
    void fl_put_u32(char* p, uint32_t v) nogil
    uint16_t fl_get_u16(const char* p) nogil
    void fl_put_u16(char* p, uint16_t v) nogil
    uint32_t fl_crc32(uint32_t crc, const void* data, size_t n) nogil
    void fl_prefetch(const void* p) nogil

# ---- Tables -------------------------------------------------------------
#
# A record in a shard's arena is packed, unaligned:
#   u32 expire_s   server second at which the record may be dropped
#   u8  keylen     or KEYLEN_LONG for a key of 255 bytes or more
#   value          `value_size` bytes owned by the algorithm
#   [u16 keylen]   only after KEYLEN_LONG
#   key            `keylen` bytes
# Outside the arena (snapshots, replication batches, slot migrations,
# takeovers) a record travels in its wire form, which those formats fix
# and no change of the arena's layout touches:
#   u32 expire_s, u16 keylen, value (`wire_value_size` bytes), key
# A table whose value is narrower in the arena than on the wire (the token
# bucket's) converts it with its `to_wire` and `from_wire`.
# Slots are Robin Hood linear probing: the record's arena offset, how far
# the slot is from the key's home slot, and 8 bits of the key's hash.  A
# probe reads another key's record only when both its home and its tag
# match ours (one key sharing our home in 256), and a delete
# shifts entries back by their distances alone; only resizing hashes the
# records' keys again.  Six bytes a slot at up to 9/10 load, where the
# hash and offset took eight at 4/5.

cdef enum:
    RECORD_HEADER = 5
    WIRE_HEADER = 6
    KEYLEN_LONG = 255
    FL_OK = 0
    FL_ENOMEM = -1
    FL_EKEYLEN = -2
    FL_EOOM = -6       # maxmemory is reached and the policy frees nothing

# A rule bucket's key starts with a u32: the rule number in its low bits,
# a split's epoch in the high byte (_rules.pyx); renumbering keeps the epoch.
cdef enum:
    RULE_NUMBER_BITS = 24
    RULE_NUMBER_MASK = 0xFFFFFF
    FL_MAX_KEY_LEN = 65535

cdef packed struct Slot:
    uint32_t off        # 0 = empty (arena offset 0 is never a record)
    uint8_t dist        # slots past the key's home (at most MAX_DIST)
    uint8_t tag         # the low 8 bits of the key's 32-bit hash

cdef enum:
    MAX_DIST = 255

cdef struct Shard:
    Slot* slots
    uint32_t nslots
    uint32_t count
    char* arena
    size_t arena_len    # bytes in use, dead records included
    size_t arena_cap    # bytes mapped
    size_t dead         # bytes of deleted records awaiting compaction

# While replicas are attached, a table notes each key a committed write
# touched (<u16 keylen><u32 shard><u32 hash><key>: where to find it without
# hashing again), so the next drain ships the key's state as it is then:
# state, not commands, so a batch sent twice does no harm.
cdef struct ChangeLog:
    char* buf
    size_t len
    size_t cap
    size_t limit        # bytes; past it notes stop and `overflowed` is set
    bint overflowed     # the log lost changes: replicas need a full copy
    int64_t first_ms    # wall time of the oldest note (lag is measured from it)

# maxmemory: one bound over every table attached to it (both stores'),
# kept in table_memory's measure (slots and the used part of each arena),
# updated incrementally while a table is attached.  A table with no bound
# (maxmemory 0) pays one NULL test per new key and nothing per check.
cdef enum EvictPolicy:
    EVICT_NONE = 0           # noeviction: -OOM to a command adding a bucket
    EVICT_NEAREST_FULL = 1   # the sampled bucket least spent (Table.spent)
    EVICT_RANDOM = 2         # any sampled bucket

cdef struct MemBound:
    size_t limit            # bytes, > 0 while tables are attached
    size_t used             # bytes of the attached tables
    uint64_t evicted        # records evicted, ever
    int policy              # EvictPolicy
    uint32_t samples        # records looked at per eviction
    uint64_t rng            # xorshift state for the samples
    Table* tables           # attached tables, linked through Table.bound_next

# What nearest-full ranks a record by: how spent its limit is at now_ms,
# relative to that limit (an exhausted bucket and one a flood key barely
# touched compare whatever their limits), in units where 2^SPENT_BITS is
# exhausted and 0 full again; the least spent is evicted first.  `ctx` is
# the table's spent_ctx (a rule engine's rules, for its tables).
cdef enum:
    SPENT_BITS = 32
ctypedef uint64_t (*record_spent)(const char* rec, uint32_t value_size, const void* ctx,
                                  int64_t now_ms) noexcept nogil

ctypedef void (*value_convert)(const char* src, char* dst) noexcept nogil

cdef struct Table:
    ChangeLog* log      # NULL while no replica is attached
    record_spent spent  # NULL: the expiry alone ranks records for eviction
    const void* spent_ctx
    MemBound* bound     # NULL unless maxmemory is set
    Table* bound_next
    size_t mem          # table_memory(), kept while bound is set
    uint32_t evict_shard  # where the next eviction round starts
    Shard* shards
    uint32_t nshards    # power of two
    uint32_t value_size       # in the arena
    uint32_t wire_value_size  # in the wire form
    value_convert to_wire     # NULL: the same bytes in both forms
    value_convert from_wire
    uint64_t long_keys  # records with a key of KEYLEN_LONG bytes or more
    uint8_t seed[16]
    uint32_t sweep_shard
    uint32_t sweep_slot
    uint64_t expired    # records removed by the sweep or lazily, ever
    uint64_t relocations  # compactions and clears: records moved in an arena

cdef inline bint long_key(const char* rec) noexcept nogil:
    return <uint8_t>rec[4] == KEYLEN_LONG

cdef inline size_t keylen_after(const char* rec, uint32_t value_size) noexcept nogil:
    return fl_get_u16(rec + RECORD_HEADER + value_size) if long_key(rec) else <uint8_t>rec[4]

cdef inline const char* key_after(const char* rec, uint32_t value_size) noexcept nogil:
    return rec + RECORD_HEADER + value_size + (2 if long_key(rec) else 0)

cdef inline size_t record_keylen(const Table* t, const char* rec) noexcept nogil:
    return keylen_after(rec, t.value_size)

cdef inline const char* record_key(const Table* t, const char* rec) noexcept nogil:
    return key_after(rec, t.value_size)

cdef inline size_t stored_size(const Table* t, size_t keylen) noexcept nogil:
    """Bytes of a record of a keylen-byte key in the arena."""
    return RECORD_HEADER + t.value_size + keylen + (2 if keylen >= KEYLEN_LONG else 0)

cdef inline size_t record_size(const Table* t, const char* rec) noexcept nogil:
    return stored_size(t, record_keylen(t, rec))

# Where a key is, or where it would go.  Valid until the table changes.
cdef struct Probe:
    Shard* shard
    uint32_t slot       # the key's slot, or where it would go
    uint32_t hash
    uint32_t dist       # slot's distance from the key's home
    bint found

cdef int table_init(Table* t, uint32_t nshards, uint32_t value_size,
                    const uint8_t* seed) noexcept nogil
# A table of token buckets (narrower in the arena than on the wire).
cdef int bucket_table_init(Table* t, uint32_t nshards, const uint8_t* seed) noexcept nogil
cdef void table_free(Table* t) noexcept nogil
cdef int table_clear(Table* t) noexcept nogil
cdef bint table_lookup(Table* t, const char* key, size_t keylen,
                       Probe* p) noexcept nogil
cdef char* probe_record(Table* t, const Probe* p) noexcept nogil
cdef char* probe_value(Table* t, const Probe* p) noexcept nogil
# now_ms: the time of the write, at which evictions it makes rank records.
cdef int table_insert(Table* t, Probe* p, const char* key, size_t keylen,
                      uint32_t expire_s, const char* value, int64_t now_ms) noexcept nogil
cdef void table_delete(Table* t, Probe* p) noexcept nogil
# A probe that found the record in an occupied slot (its key hashed again:
# a slot keeps only 8 bits of the hash), for a scan that deletes.
cdef void probe_at(const Table* t, Shard* s, uint32_t slot, Probe* p) noexcept nogil
# Attaches a table to a bound (or moves it to another); detach is a no-op
# for a table without one.
cdef void bound_attach(MemBound* b, Table* t) noexcept nogil
cdef void bound_detach(Table* t) noexcept nogil
# Frees memory in the attached tables until `need` more bytes fit under
# the limit or `rounds` rounds are done (each evicts a sixteenth of one
# shard then compacts it): FL_OK when they fit or at least `need` bytes
# were freed, else FL_EOOM.
cdef int bound_reclaim(MemBound* b, size_t need, int rounds,
                       int64_t deadline_ns, int64_t now_ms) noexcept nogil
# Eviction ranks (record_spent): part / whole (whole > 0, part below
# 2^94) in SPENT_BITS fixed point, capped at 2^SPENT_BITS.
cdef uint64_t spent_share(fl_i128 part, fl_i128 whole) noexcept nogil
# What a new record of keylen bytes in shard s would add to the count
# (itself, and the larger slot array when the shard must grow for it).
cdef size_t insert_cost(const Table* t, const Shard* s, size_t keylen) noexcept nogil
cdef enum:
    INSERT_ROUNDS = 4       # rounds one new key may run before it is refused
cdef uint64_t table_count(const Table* t) noexcept nogil
cdef size_t table_memory(const Table* t) noexcept nogil
cdef uint64_t table_sweep(Table* t, uint32_t now_s, int64_t deadline_ns,
                          uint64_t* scanned) noexcept nogil

# Snapshots: a table's live records, packed as in the arena, written to a
# file descriptor (chaining the CRC-32 of what is written), and read back.
# A loader never trusts the bytes: every record is bounds-checked.
cdef enum:
    FL_EIO = -3        # write failed (errno says why)
    FL_EFORMAT = -4    # records that do not fit their section
    FL_ERANGE = -5     # a value no call could have stored
cdef int table_dump(const Table* t, int fd, uint32_t* crc,
                    uint64_t* records) noexcept nogil
# Whether a loaded value (value_size bytes) lies within what the
# algorithm's writes can store, so the arithmetic's bounds hold for it
# as for the wire's values.
ctypedef bint (*value_check)(const char* value, uint32_t value_size) noexcept nogil
# With `deletes`, a record whose expiry second is 0 (a drain's tombstone)
# removes its key instead of being stored.  Any other record's value must
# pass `valid`, else FL_ERANGE.
cdef int table_load(Table* t, const char* buf, size_t length, uint64_t records,
                    const uint32_t* renumber, uint32_t renumber_len,
                    bint deletes, value_check valid) noexcept nogil

# The cache lines n keys will need (their home slots, then the records in
# them), requested together so that their misses overlap instead of coming
# one after another as the keys' commands run (a pipelined read's CL.CHECKs:
# _protocol.pyx prefetch_checks); n at most PREFETCH_MAX.  The keys' hashes
# go to `hashes`, for bucket_check.
cdef enum:
    PREFETCH_MAX = 64
cdef void table_prefetch(Table* t, const char* const* keys, const size_t* lens,
                         int n, uint64_t* hashes) noexcept nogil

# ---- Change logs ------------------------------------------------------------
cdef enum:
    NOTE_HEADER = 10
cdef int changelog_append(ChangeLog* log, uint32_t shard, uint32_t hash,
                          const char* key, size_t keylen) noexcept nogil

cdef inline void note_change(Table* t, const Probe* p, const char* key,
                             size_t keylen) noexcept nogil:
    # What every committed write runs (p: the probe that found the key's
    # place): a test of a pointer that is NULL unless a replica is attached.
    if t.log != NULL:
        changelog_append(t.log, <uint32_t>(p.shard - t.shards), p.hash, key, keylen)

cdef int table_track(Table* t, size_t limit) noexcept nogil
cdef void table_untrack(Table* t) noexcept nogil
# The noted keys' current records, deduplicated, packed as table_dump
# writes them (absent keys as tombstones), in a malloc'ed buffer the
# caller frees; the log is emptied.
cdef int table_drain(Table* t, char** out, size_t* outlen,
                     uint64_t* records) noexcept nogil

# ---- Cluster slots --------------------------------------------------------
#
# A record's hash slot is the slot of the key a client routes by: the whole
# key for CL.CHECK and CL.THROTTLE buckets, the client key inside a rule
# bucket's key (_rules.pyx).  A route_key function finds that key in a
# record's key: 0 and out/outlen set, or -1 when the record has no slot
# (a bucket of a rule that is gone, which nothing reads again).
ctypedef int (*route_key)(const char* key, size_t keylen, const void* ctx,
                          const char** out, size_t* outlen) noexcept nogil
cdef int whole_key(const char* key, size_t keylen, const void* ctx,
                   const char** out, size_t* outlen) noexcept nogil
cdef int record_slot(const Table* t, const char* rec, route_key route,
                     const void* ctx) noexcept nogil

# Live records of one slot (no index: a scan of the whole table; Redis
# keeps a per-slot index instead, fastlimit spends no memory on one).
cdef uint64_t table_count_slot(const Table* t, int slot, int64_t now_ms,
                               route_key route, const void* ctx) noexcept nogil

# Up to `limit` distinct routing keys, deduplicated by a hash set over the
# buffer, which holds them as <u16 length><key>.
cdef struct KeyList:
    char* buf
    size_t len
    size_t cap
    uint32_t* set       # offsets + 1 into buf; 0 = empty
    uint32_t setcap     # power of two
    uint32_t count
    uint32_t limit
    uint8_t seed[16]
cdef int table_slot_keys(Table* t, int slot, int64_t now_ms, route_key route,
                         const void* ctx, KeyList* out) noexcept nogil

# A walk over a table's arenas that resumes where it stopped: arenas only
# grow at their end and keep deleted records in place, so an offset stays
# valid until a compaction or a clear moves records (`relocations`), and
# then the shard is walked again from its start (a record seen twice is
# harmless: loading it again stores the same state).  A shard is walked up
# to where its arena ended when the walk entered it: records added later
# are new writes, which a change log carries, and the walk always ends.
cdef struct ArenaCursor:
    uint32_t shard
    size_t pos          # 0: the shard's start
    size_t end          # the shard's arena length when the walk entered it
    uint64_t relocations
    bint done
# Copies every live record whose slot is set in mask (CLUSTER_SLOTS bytes)
# into a malloc'ed buffer (packed as table_dump writes them), until the
# walk ends, the deadline passes or max_bytes are taken.
cdef int table_export(Table* t, const unsigned char* mask, route_key route,
                      const void* ctx, ArenaCursor* cur, int64_t deadline_ns,
                      size_t max_bytes, char** out, size_t* outlen,
                      uint64_t* records) noexcept nogil
# Deletes them instead (noted as changes, so standbys forget them too).
cdef int table_delete_slots(Table* t, const unsigned char* mask, route_key route,
                            const void* ctx, ArenaCursor* cur, int64_t deadline_ns,
                            uint64_t* deleted) noexcept nogil

# ---- Token bucket ---------------------------------------------------------
#
# Tokens are integer milli-tokens as in the reference algorithm.  A refill
# period other than one second is kept exact with a remainder carried in
# units of 1/period_ms milli-tokens.

cdef struct BucketParams:
    int64_t capacity      # tokens, >= 1
    int64_t refill        # tokens added per period, >= 1
    int64_t period_ms     # >= 1; 1000 = tokens per second
    int64_t cost          # >= 0; 0 reports without consuming

cdef struct CheckResult:
    int64_t allowed
    int64_t limit
    int64_t remaining
    int64_t retry_after_ms
    int64_t reset_after_ms

# A token bucket's value on the wire: i64 tokens (milli-tokens), i64
# last_ms, u32 fraction of a milli-token.  In the arena the same three in
# 17 bytes: tokens (below 2^60: 10^18 at most) and last_ms (below 2^44:
# MAX_NOW_MS is 4e12) share 13 bytes, then the fraction.
cdef enum:
    BUCKET_VALUE_SIZE = 20
    BUCKET_STORED_SIZE = 17

cdef inline int64_t bucket_tokens(const char* v) noexcept nogil:
    return <int64_t>(<uint64_t>fl_get_i64(v) & ((<uint64_t>1 << 60) - 1))

cdef inline int64_t bucket_last(const char* v) noexcept nogil:
    return <int64_t>((<uint64_t>fl_get_i64(v) >> 60)
                     | (<uint64_t>fl_get_u32(v + 8) << 4)
                     | (<uint64_t>(<uint8_t>v[12]) << 36))

cdef inline uint32_t bucket_fraction(const char* v) noexcept nogil:
    return fl_get_u32(v + 13)

cdef inline void bucket_put(char* v, int64_t tokens, int64_t last,
                            uint32_t fraction) noexcept nogil:
    invariant(0 <= tokens < (<int64_t>1 << 60) and 0 <= last < (<int64_t>1 << 44))
    fl_put_i64(v, <int64_t>(<uint64_t>tokens | (<uint64_t>last << 60)))
    fl_put_u32(v + 8, <uint32_t>(<uint64_t>last >> 4))
    v[12] = <char>(<uint64_t>last >> 36)
    fl_put_u32(v + 13, fraction)

cdef extern from "fl_native.h":
    # Input bounds that keep every intermediate value representable.
    const int64_t MAX_CAPACITY       # 10**15 tokens
    const int64_t MAX_REFILL         # 10**15 tokens per period
    const int64_t MAX_PERIOD_MS      # 2**32 - 1: the remainder is a u32
    const int64_t MAX_REFILL_TIME_MS # 10**15 ms to refill a whole bucket
    const int64_t MAX_NOW_MS         # 4 * 10**12 (year 2096): expiry seconds fit a u32

cdef const char* bucket_params_error(const BucketParams* bp) noexcept nogil
# h: the key's table hash when known (table_prefetch's), else 0
cdef int bucket_check(Table* t, const char* key, size_t keylen, uint64_t h,
                      const BucketParams* bp, int64_t now_ms, bint commit,
                      CheckResult* out) noexcept nogil
cdef int bucket_reset(Table* t, const char* key, size_t keylen) noexcept nogil
cdef uint32_t expire_second(int64_t ms) noexcept nogil
cdef bint record_live(Table* t, const Probe* p, int64_t now_ms) noexcept nogil


cdef class Clock:
    """Server time in integer milliseconds: the wall clock, or a manual
    clock that only moves when told (for tests)."""
    cdef readonly bint manual
    cdef int64_t manual_ms
    cdef int64_t now_ms(self) noexcept


cdef object dump_table(const Table* t, int fd, uint32_t crc)
cdef uint32_t dump_section(const Table* t, int fd, uint32_t crc, bytes name) except? 0
cdef int load_table(Table* t, const unsigned char[:] data, uint64_t records,
                    list renumber, value_check valid, bint deletes=*) except -1
cdef bint in_range(int64_t v, int64_t low, int64_t high) noexcept nogil
cdef bint bucket_value_ok(const char* value, uint32_t value_size) noexcept nogil
cdef list drain_section(Table* t, bytes name)
cdef bint log_overflowed(const Table* t) noexcept
cdef object oldest_note(const Table* t)


cdef class SlotKeys:
    """GETKEYSINSLOT's answer being gathered over several tables."""
    cdef KeyList kl


cdef class SlotCursor:
    """Where an export or deletion of slots stands, over one table or a
    list of named tables."""
    cdef ArenaCursor arena
    cdef unsigned char mask[16384]
    cdef readonly bytes table      # name of the table being walked
    cdef readonly set finished     # names of the tables walked to their end
    cdef readonly uint64_t records  # exported or deleted so far


# The slot helpers over a list of (name, table address, routed by rule):
# rule tables find their routing key with `rule_route` (and ctx), the
# others use the whole key.
cdef uint64_t count_in_slot(list named, route_key rule_route, const void* ctx,
                            int slot, int64_t now_ms) except? 0
cdef int keys_in_slot(list named, route_key rule_route, const void* ctx, int slot,
                      int64_t now_ms, SlotKeys keys) except -1
# The records of a section (a drain's, tombstones included) whose slot is
# in mask, as a section again ([] when none is).
cdef list filter_section(bytes name, uint32_t value_size, const unsigned char[:] data,
                         uint64_t records, bytes mask, route_key route, const void* ctx)
cdef object walk_slots(list named, route_key rule_route, const void* ctx,
                       SlotCursor cursor, double budget_ms, size_t max_bytes, bint delete)


cdef class Decision:
    cdef readonly bint allowed
    cdef readonly int64_t limit
    cdef readonly int64_t remaining
    cdef readonly int64_t retry_after_ms
    cdef readonly int64_t reset_after_ms
    cdef readonly str source


cdef class MemoryBound:
    """maxmemory and its policy, over the tables of the stores given
    it (BucketStore.set_bound, RuleEngine.set_bound)."""
    cdef MemBound b


cdef void set_table_bound(Table* t, MemoryBound bound) noexcept
cdef object raise_for(int rc)


cdef class BucketStore:
    """The token-bucket tables, owned by one server or one embedded
    limiter.  Python-facing methods validate; cdef methods trust."""
    cdef Table table
    cdef readonly Clock clock
    cdef int check_c(self, const char* key, size_t keylen,
                     const BucketParams* bp, int64_t now_ms,
                     CheckResult* out) noexcept
    cdef int checked(self, bytes key, int64_t capacity, int64_t refill_per_sec,
                     int64_t cost, int64_t period_ms, now_ms, CheckResult* out) except -1
    cdef list slot_tables(self)
