"""Raw windowed counters for the `limits` library's strategies (CL.FIXED,
CL.MOVING, CL.SLIDING; fastlimit/windows/), in the kernel's C tables.

`limits` asks its storage for three things fastlimit's own algorithms do
not give exactly: a counter whose window starts at its first increment
and which counts past the limit (the fixed window: the storage is never
told the limit), a log of acquisitions (the moving window) and two
clock-aligned window counts (the sliding window counter).  Each is one
call here, decided in C at the server's time, so a strategy's hit, test
and stats are one round trip each and atomic.

Records (the kernel's packed records, _core.pxd; all times server ms):

  counters  i64 count, i64 expire_ms        the window ends at expire_ms
  sliding   i64 window, i64 previous, i64 current
                                           window = now // length; the
                                           counts of that window and the
                                           one before
  logs[k]   u32 n, then n runs (i64 time_ms, i64 entries), newest
                                           first, room for 2^k runs: one
                                           table per size class, a key's log
                                           moving up as it grows

No Python object is kept per key; the record's expiry second lets the
sweep (server/expiry.py) drop idle keys.

The store is carried as the bucket stores are (BucketStore, RuleEngine):
every write is noted in the tables' change logs (replication, slot
moves), the tables are snapshot sections ("windows:fixed",
"windows:sliding", "windows:log:<k>"; server/snapshot.py), they count
toward maxmemory and evict under it, and a slot's records are exported
and deleted by slot (cluster/reshard.py).  A log moving up a size class is
a tombstone in the old class's table and a record in the new one's.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport int64_t, uint64_t, uint32_t, uint8_t, INT64_MAX
from libc.string cimport memcpy, memmove, memset

from fastlimit._core cimport (Table, Probe, Shard, Clock, FL_OK, FL_MAX_KEY_LEN,
                              record_key, record_keylen, MAX_NOW_MS, fl_get_u32, fl_put_u32, fl_get_u16,
                              fl_get_i64, fl_put_i64, fl_mono_ns, fl_i128,
                              table_init, table_free, table_clear, table_lookup,
                              table_insert, table_delete, probe_at, table_count, table_memory,
                              table_sweep, probe_value, probe_record, expire_second,
                              raise_for, note_change, table_track, table_untrack,
                              log_overflowed, oldest_note, drain_section, dump_section,
                              load_table, value_check, in_range, whole_key, MemoryBound,
                              set_table_bound, SlotKeys, SlotCursor, count_in_slot,
                              keys_in_slot, walk_slots, filter_section)

from fastlimit._core import checked_slot

import os

# Bounds that keep every intermediate value an exact 64/128-bit integer.
cdef int64_t C_MAX_LIMIT = 10**15
cdef int64_t C_MAX_LENGTH_MS = 10**11
MAX_AMOUNT = 10**15
MAX_LIMIT = C_MAX_LIMIT
MAX_LENGTH_MS = C_MAX_LENGTH_MS  # a window of up to about three years
MAX_LOG_CLASS = 20             # a log holds at most 2^20 runs (distinct hit times)

cdef enum:
    COUNTER_SIZE = 16
    SLIDING_SIZE = 24
    NCLASSES = 21               # MAX_LOG_CLASS + 1
    RUN = 16                    # a log's run: i64 time_ms, i64 entries
    SHARDS = 64
    MIN_LOG_SHARDS = 8


cdef inline int64_t clamp_add(int64_t a, int64_t b) noexcept nogil:
    return INT64_MAX if a > INT64_MAX - b else a + b


cdef class WindowStore:
    """The tables of the three windowed kinds.  Python-facing methods take
    validated numbers (server/arguments.py and windows/commands.py check
    them) and the time; each call is one decision."""
    cdef Table t_counters
    cdef Table t_sliding
    cdef Table t_logs[NCLASSES]
    cdef int ntables
    cdef readonly Clock clock

    def __cinit__(self, Clock clock=None):
        cdef bytes seed = os.urandom(16)
        cdef int k
        self.ntables = 0
        self.clock = clock if clock is not None else Clock()
        if table_init(&self.t_counters, SHARDS, COUNTER_SIZE,
                      <const uint8_t*>PyBytes_AS_STRING(seed)) != FL_OK:
            raise MemoryError()
        self.ntables = 1
        if table_init(&self.t_sliding, SHARDS, SLIDING_SIZE,
                      <const uint8_t*>PyBytes_AS_STRING(seed)) != FL_OK:
            raise MemoryError()
        self.ntables = 2
        for k in range(NCLASSES):
            # fewer shards for the larger classes: an empty shard costs its
            # slots and header (counted toward maxmemory), and the larger
            # classes hold few keys
            if table_init(&self.t_logs[k], max(MIN_LOG_SHARDS, SHARDS >> k), 4 + RUN * (1 << k),
                          <const uint8_t*>PyBytes_AS_STRING(seed)) != FL_OK:
                raise MemoryError()
            self.ntables = 3 + k

    def __dealloc__(self):
        cdef int k
        if self.ntables >= 1:
            table_free(&self.t_counters)
        if self.ntables >= 2:
            table_free(&self.t_sliding)
        for k in range(NCLASSES):
            if self.ntables >= 3 + k:
                table_free(&self.t_logs[k])

    cdef Table* table_at(self, int i) noexcept:
        if i == 0:
            return &self.t_counters
        if i == 1:
            return &self.t_sliding
        return &self.t_logs[i - 2]

    cdef int64_t now(self, now_ms) except? -1:
        return self.clock.now_ms() if now_ms is None else <int64_t>now_ms

    # ---- the fixed window: a raw counter ------------------------------------

    def fixed(self, bytes key, int64_t length_ms, int64_t amount, now_ms=None):
        """Adds amount to the counter (amount 0 reads it, writing nothing);
        a counter that is absent or past its window starts one of length_ms
        now.  Returns [count, expire_ms] (expire_ms is now for no counter)."""
        cdef int64_t now = self.now(now_ms)
        cdef Probe p
        cdef char* v
        cdef char buf[COUNTER_SIZE]
        cdef int64_t count = 0, expire = now
        cdef int rc
        if table_lookup(&self.t_counters, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &p):
            v = probe_value(&self.t_counters, &p)
            if fl_get_i64(v + 8) > now:
                count = fl_get_i64(v)
                expire = fl_get_i64(v + 8)
        if amount == 0:
            return [count, expire]
        if count == 0:
            expire = now + length_ms      # limits: the window starts at the first increment
        count = clamp_add(count, amount)
        if p.found:
            v = probe_value(&self.t_counters, &p)
            fl_put_i64(v, count)
            fl_put_i64(v + 8, expire)
            fl_put_u32(probe_record(&self.t_counters, &p), expire_second(expire))
        else:
            fl_put_i64(buf, count)
            fl_put_i64(buf + 8, expire)
            rc = table_insert(&self.t_counters, &p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                              expire_second(expire), buf, now)
            if rc != FL_OK:
                raise_for(rc)
        note_change(&self.t_counters, &p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        return [count, expire]

    # ---- the sliding window counter ---------------------------------------------

    def sliding(self, bytes key, int64_t limit, int64_t length_ms, int64_t amount,
                now_ms=None):
        """limits' sliding window counter over clock-aligned windows of
        length_ms: the weighted count is previous * previous_ttl / length +
        current (floored, exactly), and amount is added to the current
        window if that count plus amount stays within limit (amount 0 reads,
        writing nothing).  Returns [allowed, previous, previous_ttl_ms,
        current, current_ttl_ms] as they are after the call."""
        cdef int64_t now = self.now(now_ms)
        cdef int64_t window = now // length_ms, into = now % length_ms
        cdef int64_t previous = 0, current = 0, previous_ttl, weighted
        cdef Probe p
        cdef char* v
        cdef char buf[SLIDING_SIZE]
        cdef int64_t stored
        cdef bint allowed = False
        cdef int rc
        if table_lookup(&self.t_sliding, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &p):
            v = probe_value(&self.t_sliding, &p)
            stored = fl_get_i64(v)
            if stored == window:
                previous = fl_get_i64(v + 8)
                current = fl_get_i64(v + 16)
            elif stored == window - 1:
                previous = fl_get_i64(v + 16)
        previous_ttl = length_ms - into if previous else 0
        weighted = <int64_t>((<fl_i128>previous * previous_ttl) // length_ms) + current
        if 0 < amount <= limit and weighted <= limit - amount:
            allowed = True
            current += amount
            fl_put_i64(buf, window)
            fl_put_i64(buf + 8, previous)
            fl_put_i64(buf + 16, current)
            # the current window's count is read until the next window ends
            if p.found:
                memcpy(probe_value(&self.t_sliding, &p), buf, SLIDING_SIZE)
                fl_put_u32(probe_record(&self.t_sliding, &p),
                           expire_second((window + 2) * length_ms))
            else:
                rc = table_insert(&self.t_sliding, &p, PyBytes_AS_STRING(key),
                                  PyBytes_GET_SIZE(key), expire_second((window + 2) * length_ms),
                                  buf, now)
                if rc != FL_OK:
                    raise_for(rc)
            note_change(&self.t_sliding, &p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        return [int(allowed), previous, previous_ttl, current, length_ms - into + length_ms]

    # ---- the moving window: a log --------------------------------------------------

    cdef int find_log(self, bytes key, Probe* p) noexcept:
        """The class whose table holds the key's log (p its probe), or -1."""
        cdef int k
        for k in range(NCLASSES):
            if table_lookup(&self.t_logs[k], PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), p):
                return k
        return -1

    def moving(self, bytes key, int64_t limit, int64_t length_ms, int64_t amount,
               now_ms=None):
        """limits' moving window: amount entries are logged now unless the
        entry limit - amount places back (newest first) is at most
        length_ms old (amount 0 reads, writing nothing).  Returns [allowed,
        window_start_ms, count]: the oldest entry younger than length_ms
        (now when none) and how many are, after the call.  The log is runs
        of (time, entries), the runs of the window only, at most limit
        entries."""
        cdef int64_t now = self.now(now_ms)
        cdef Probe p, moved
        cdef int k = self.find_log(key, &p)
        cdef char* v = NULL
        cdef char* runs
        cdef uint32_t n = 0, i, m
        cdef int64_t before = limit - amount, seen = 0, ts, cnt, start = now, count = 0
        cdef bint allowed = False
        cdef int rc, nk
        if k >= 0:
            v = probe_value(&self.t_logs[k], &p)
            n = fl_get_u32(v)
        if 0 < amount <= limit:
            allowed = True
            for i in range(n):
                ts = fl_get_i64(v + 4 + RUN * i)
                seen += fl_get_i64(v + 12 + RUN * i)
                if seen > before:
                    allowed = ts < now - length_ms
                    break
        if allowed:
            # the new runs: (now, amount) first, then the old ones that are
            # in the window (inclusive), up to limit entries in all
            runs = <char*>PyMem_Malloc(RUN * (n + 1))
            if runs == NULL:
                raise MemoryError()
            try:
                fl_put_i64(runs, now)
                fl_put_i64(runs + 8, amount)
                m = 1
                seen = amount
                for i in range(n):
                    ts = fl_get_i64(v + 4 + RUN * i)
                    cnt = fl_get_i64(v + 12 + RUN * i)
                    if ts < now - length_ms or seen >= limit:
                        break
                    if ts == now and m == 1:
                        fl_put_i64(runs + 8, min(limit, amount + cnt))
                        seen = min(limit, amount + cnt)
                        continue
                    cnt = min(cnt, limit - seen)
                    fl_put_i64(runs + RUN * m, ts)
                    fl_put_i64(runs + RUN * m + 8, cnt)
                    seen += cnt
                    m += 1
                nk = 0
                while nk < NCLASSES and (<uint32_t>1 << nk) < m:
                    nk += 1
                if nk == NCLASSES:
                    raise OverflowError(
                        f"a moving window's log holds at most {1 << MAX_LOG_CLASS} runs")
                if k < 0 or nk > k:
                    # the new class's record first: one refused under
                    # maxmemory leaves the old log as it was
                    table_lookup(&self.t_logs[nk], PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                                 &moved)
                    rc = self.insert_empty(&self.t_logs[nk], &moved, key, now)
                    if rc != FL_OK:
                        raise_for(rc)
                    # then the old class's goes (found again: making room
                    # may have evicted or moved it)
                    if k >= 0 and table_lookup(&self.t_logs[k], PyBytes_AS_STRING(key),
                                               PyBytes_GET_SIZE(key), &p):
                        table_delete(&self.t_logs[k], &p)
                        note_change(&self.t_logs[k], &p, PyBytes_AS_STRING(key),
                                    PyBytes_GET_SIZE(key))
                    k = nk
                    p = moved
                v = probe_value(&self.t_logs[k], &p)
                fl_put_u32(v, m)
                memcpy(v + 4, runs, RUN * m)
                n = m
                fl_put_u32(probe_record(&self.t_logs[k], &p), expire_second(now + length_ms + 1))
                note_change(&self.t_logs[k], &p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
            finally:
                PyMem_Free(runs)
        # what the window holds: entries strictly younger than length_ms
        for i in range(n):
            ts = fl_get_i64(v + 4 + RUN * i)
            if ts <= now - length_ms:
                break
            start = ts
            count += fl_get_i64(v + 12 + RUN * i)
        return [int(allowed), start, count]

    cdef int insert_empty(self, Table* t, Probe* p, bytes key, int64_t now) except? -9:
        cdef bytes zero = bytes(t.value_size)
        return table_insert(t, p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                            expire_second(now), PyBytes_AS_STRING(zero), now)

    # ---- clearing ---------------------------------------------------------------------

    def clear(self, bytes key):
        """Forgets the key in every kind; returns how many records it had."""
        cdef Probe p
        cdef int i, removed = 0
        cdef Table* t
        for i in range(2 + NCLASSES):
            t = self.table_at(i)
            if table_lookup(t, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &p):
                table_delete(t, &p)
                note_change(t, &p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
                removed += 1
        return removed

    def clear_prefix(self, bytes prefix):
        """Forgets every key that starts with prefix (a scan of every
        record: limits' storage reset, an administrative call); returns how
        many records went."""
        cdef const char* pre = PyBytes_AS_STRING(prefix)
        cdef size_t plen = PyBytes_GET_SIZE(prefix)
        cdef uint64_t removed = 0
        cdef int i
        cdef uint32_t s, j
        cdef Table* t
        cdef Shard* sh
        cdef char* rec
        cdef Probe p
        for i in range(2 + NCLASSES):
            t = self.table_at(i)
            for s in range(t.nshards):
                sh = &t.shards[s]
                j = 0
                while j < sh.nslots:
                    if sh.slots[j].off != 0:
                        rec = sh.arena + sh.slots[j].off
                        if (record_keylen(t, rec) >= plen and
                                memcmp_prefix(record_key(t, rec), pre, plen)):
                            probe_at(t, sh, j, &p)
                            note_change(t, &p, record_key(t, rec), record_keylen(t, rec))
                            table_delete(t, &p)
                            removed += 1
                            continue      # a later record may have shifted into slot j
                    j += 1
        return removed

    def flush(self):
        cdef int i
        for i in range(2 + NCLASSES):
            if table_clear(self.table_at(i)) != FL_OK:
                raise MemoryError()

    # ---- carried as the buckets are: snapshots, replication, maxmemory, slots --------

    cdef list named_tables(self):
        """(section name, table address) of every table, in a fixed order."""
        cdef int i
        return [(section_name(i), <size_t>self.table_at(i)) for i in range(2 + NCLASSES)]

    def dump(self, int fd, uint32_t crc=0):
        """Writes the tables as snapshot sections (a log class's only when it
        holds records: most never do); returns (sections, crc32 chained
        from crc)."""
        cdef int i
        cdef int sections = 0
        for i in range(2 + NCLASSES):
            if i >= 2 and table_count(self.table_at(i)) == 0:
                continue
            crc = dump_section(self.table_at(i), fd, crc, section_name(i))
            sections += 1
        return sections, crc

    def load_section(self, bytes name, uint32_t value_size, const unsigned char[:] data,
                     uint64_t records, bint deletes=False):
        """Loads one section this store dumped or drained (a drain's
        tombstones remove keys when `deletes`).  False when the name is not
        one of this store's; ValueError when its records are malformed or
        hold values no call could have stored."""
        cdef int i = section_index(name)
        cdef Table* t
        if i < 0:
            return False
        t = self.table_at(i)
        if value_size != t.wire_value_size:
            raise ValueError(f"value size {value_size}, not {t.wire_value_size}")
        load_table(t, data, records, None,
                   counter_value_ok if i == 0 else sliding_value_ok if i == 1 else log_value_ok,
                   deletes)
        return True

    def track_changes(self, size_t limit):
        """Starts noting written keys in every table (emptying what was
        noted); limit is each table's log size in bytes."""
        cdef int i
        for i in range(2 + NCLASSES):
            if table_track(self.table_at(i), limit) != FL_OK:
                raise MemoryError()

    def untrack_changes(self):
        cdef int i
        for i in range(2 + NCLASSES):
            table_untrack(self.table_at(i))

    def changes_overflowed(self):
        cdef int i
        for i in range(2 + NCLASSES):
            if log_overflowed(self.table_at(i)):
                return True
        return False

    def oldest_change_ms(self):
        """Wall time of the oldest change not drained yet, or None."""
        cdef int i
        return min(filter(None, [oldest_note(self.table_at(i)) for i in range(2 + NCLASSES)]),
                   default=None)

    def drain_changes(self):
        """The noted keys' states as snapshot sections, in parts (see
        BucketStore.drain_changes), one section per table that changed."""
        cdef int i
        sections = []
        for i in range(2 + NCLASSES):
            sections += drain_section(self.table_at(i), section_name(i))
        return sections

    def set_bound(self, MemoryBound bound):
        """Puts every table under a memory bound, or none (None)."""
        cdef int i
        for i in range(2 + NCLASSES):
            set_table_bound(self.table_at(i), bound)

    cdef list slot_tables(self):
        return [(name, address, False) for name, address in self.named_tables()]

    def count_in_slot(self, int slot, now_ms=None):
        """Live records of a hash slot (a scan of every table)."""
        return count_in_slot(self.slot_tables(), NULL, NULL, checked_slot(slot),
                             self.now(now_ms))

    def keys_in_slot(self, SlotKeys keys, int slot, now_ms=None):
        keys_in_slot(self.slot_tables(), NULL, NULL, checked_slot(slot), self.now(now_ms), keys)

    def export_slots(self, SlotCursor cursor, double budget_ms=1.0,
                     size_t max_bytes=1 << 20):
        """The next records of the cursor's slots as snapshot sections (load
        them with load_section), within budget_ms and about max_bytes."""
        return walk_slots(self.slot_tables(), NULL, NULL, cursor, budget_ms, max_bytes, False)

    def delete_slots(self, SlotCursor cursor, double budget_ms=1.0):
        return walk_slots(self.slot_tables(), NULL, NULL, cursor, budget_ms, 0, True)

    def filter_section(self, bytes mask, bytes name, uint32_t value_size,
                       const unsigned char[:] data, uint64_t records):
        """A drained section's records in mask's slots, as a section ([]
        when none)."""
        return filter_section(name, value_size, data, records, mask, whole_key, NULL)

    # ---- upkeep --------------------------------------------------------------------

    def sweep(self, now_ms=None, double budget_ms=1.0):
        """Drops records whose windows have ended, for at most budget_ms
        (server/expiry.py's interface).  Returns (removed, slots_scanned)."""
        cdef int64_t now = self.now(now_ms)
        cdef uint64_t scanned = 0, s = 0, removed = 0
        cdef int64_t deadline = fl_mono_ns() + <int64_t>(budget_ms * 1e6)
        cdef int i
        for i in range(2 + NCLASSES):
            if table_count(self.table_at(i)) == 0:
                continue
            s = 0
            removed += table_sweep(self.table_at(i), expire_second(now - 999), deadline, &s)
            scanned += s
            if fl_mono_ns() >= deadline:
                break
        return removed, scanned

    def __len__(self):
        cdef uint64_t n = 0
        cdef int i
        for i in range(2 + NCLASSES):
            n += table_count(self.table_at(i))
        return n

    @property
    def memory_bytes(self):
        cdef size_t n = 0
        cdef int i
        for i in range(2 + NCLASSES):
            n += table_memory(self.table_at(i))
        return n


cdef inline bint memcmp_prefix(const char* a, const char* b, size_t n) noexcept nogil:
    cdef size_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


# ---- sections and the values a loader takes ---------------------------------------

SECTION_PREFIX = b"windows:"


cdef bytes section_name(int i):
    if i == 0:
        return b"windows:fixed"
    if i == 1:
        return b"windows:sliding"
    return b"windows:log:%d" % (i - 2)


cdef int section_index(bytes name):
    """The table a section name stands for, or -1."""
    if name == b"windows:fixed":
        return 0
    if name == b"windows:sliding":
        return 1
    if name.startswith(b"windows:log:"):
        digits = name[12:]
        if digits.isdigit() and len(digits) <= 2 and int(digits) < NCLASSES:
            return 2 + int(digits)
    return -1


cdef bint counter_value_ok(const char* v, uint32_t value_size) noexcept nogil:
    return (in_range(fl_get_i64(v), 0, INT64_MAX) and
            in_range(fl_get_i64(v + 8), 0, MAX_NOW_MS + C_MAX_LENGTH_MS))


cdef bint sliding_value_ok(const char* v, uint32_t value_size) noexcept nogil:
    return (in_range(fl_get_i64(v), 0, MAX_NOW_MS) and
            in_range(fl_get_i64(v + 8), 0, C_MAX_LIMIT) and
            in_range(fl_get_i64(v + 16), 0, C_MAX_LIMIT))


cdef bint log_value_ok(const char* v, uint32_t value_size) noexcept nogil:
    """n runs that fit the class, newest first, at times a clock can show,
    each of at least one entry and at most a limit's worth in all."""
    cdef uint32_t n = fl_get_u32(v), i
    cdef int64_t total = 0, ts, entries, newer = MAX_NOW_MS
    if n == 0 or <uint64_t>n * RUN > value_size - 4:
        return False
    for i in range(n):
        ts = fl_get_i64(v + 4 + RUN * i)
        entries = fl_get_i64(v + 12 + RUN * i)
        if not in_range(ts, 0, newer) or not in_range(entries, 1, C_MAX_LIMIT - total):
            return False
        newer = ts
        total += entries
    return True
