"""The per-connection protocol state machine; see _protocol.pxd."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from cpython.ref cimport PyObject
from libc.string cimport memcmp, memcpy, memmove, memset

from fastlimit._cluster cimport key_slot
from fastlimit._rules cimport (RuleEngine, FL_ESPLIT, FL_ESPLITMIX, FL_SPLIT_MAX, FL_EHOME,
                               FL_EHOMEDOWN,
                               FL_SPLIT_SUFFIX_MAX, fl_split_parse, fl_split_subkey,
                               fl_split_base,
                               fl_split_share, fl_split_random, split_pick, split_refused)
from fastlimit._hotkeys cimport (HotKeys, fl_hk, fl_hk_due, fl_hk_begin, fl_hk_count,
                                 FL_HK_BUCKET)
from fastlimit._load cimport (LoadMeter, fl_load, fl_load_sheds, fl_load_hold, fl_load_release,
                              fl_load_count_shed, fl_priority_parse, FL_PRIO_UNSET,
                              FL_PRIO_LOW, FL_PRIO_NORMAL, FL_PRIO_CRITICAL, FL_SHED_REMAINING,
                              FL_SHED_RETRY_MS, FL_LOAD_DRAIN_NS)
from fastlimit._core cimport (BucketParams, CheckResult, bucket_check, MAX_CAPACITY,
                              bucket_params_error, fl_mono_ns, FL_OK, FL_EKEYLEN,
                              FL_EOOM, PREFETCH_MAX, Table, table_prefetch)
from fastlimit._core import OOM_ERROR
from fastlimit._resp cimport (Parser, ParseLimits, Arg, Writer, parser_init,
                              parser_free, parser_reserve, parser_release,
                              parser_memory, parse_command,
                              parse_int64, writer_init, writer_reset, write_raw,
                              write_prefixed_int, write_bulk, write_line,
                              encode_reply, PARSE_COMMAND,
                              PARSE_EMPTY, PARSE_ERROR, PARSE_INCOMPLETE)

import asyncio
import base64
import collections
import binascii
import logging
import time

from fastlimit._resp import ReplyError, Sliced


class Awaited:
    """A reply that waits on the network (other nodes' answers), as Redis
    blocks a client on WAIT: the handler returns ``Awaited(coroutine)``,
    the connection holds its own later commands and serves nobody less
    meanwhile; the coroutine's return value is the reply (or it raises
    ReplyError).  The coroutine must bound its own time.  Inside EXEC
    there is no waiting, so it is refused there."""

    __slots__ = ("coro", "task", "reply")

    def __init__(self, coro):
        self.coro = coro
        self.task = None
        self.reply = None

    def begin(self, wake):
        """Starts the coroutine; wake() is called once it is done."""
        self.task = asyncio.ensure_future(self.coro)
        self.task.add_done_callback(lambda task: _mark_retrieved(task) or wake())

    def advance(self, double budget_s):
        """True once the reply is made (raises what the coroutine raised)."""
        if self.task is None or not self.task.done():
            return False
        self.reply = self.task.result()
        return True

    def finish(self):
        self.coro.close()
        raise ReplyError("ERR this command waits on other nodes, which it cannot do "
                         "inside MULTI")


def _mark_retrieved(task):
    # The connection may be gone when the task ends; its error, if any,
    # must not then be logged as "never retrieved".
    if not task.cancelled():
        task.exception()


# All replies of one read are gathered here and sent with one write.
# The server is single-threaded and a read is handled to completion
# before the next, so one buffer serves every connection.
cdef Writer OUT
if writer_init(&OUT, 16384) != 0:
    raise MemoryError()


# ---- prefetching a pipelined read's buckets (bench/README.md, "Memory") ----------
#
# With many buckets nearly every check misses the CPU caches twice (its hash
# slot, then its record), one miss after another.  Before a read's commands
# run, the keys of the CL.CHECKs at its start are found and their cache
# lines requested together (table_prefetch), so the misses overlap and the
# commands then find their buckets in the cache.  It changes nothing of what
# runs: a line requested for nothing costs a little bandwidth.  Only for a
# table larger than the caches (PREFETCH_MIN_SLOTS), where it pays.

cdef enum:
    # 2 MB of slots, some 20 MB of buckets: past what the caches hold (on
    # smaller tables the scan and the hashes cost more than the misses)
    PREFETCH_MIN_SLOTS = 1 << 18


cdef inline bint table_is_large(const Table* t) noexcept nogil:
    return <size_t>t.shards[0].nslots * t.nshards >= PREFETCH_MIN_SLOTS


# The prefetched keys, in the order their commands come, with their hashes,
# so that each check uses its hash instead of hashing again
# (next_prefetched_hash).  Valid only during the run_commands that made
# them: the keys point into its buffer, and it clears them when it ends.
cdef const char* PREFETCHED[PREFETCH_MAX]
cdef uint64_t PREFETCHED_HASH[PREFETCH_MAX]
cdef int PREFETCHED_N = 0
cdef int PREFETCHED_AT = 0


cdef void prefetch_checks(Table* t, const char* buf, size_t n) noexcept nogil:
    """Requests the buckets of the CL.CHECKs that begin buf; one command
    alone waits for its miss either way."""
    global PREFETCHED_N, PREFETCHED_AT
    cdef size_t lens[PREFETCH_MAX]
    cdef int found = scan_check_keys(buf, n, PREFETCHED, lens)
    PREFETCHED_AT = 0
    if found > 1:
        table_prefetch(t, PREFETCHED, lens, found, PREFETCHED_HASH)
        PREFETCHED_N = found


cdef inline uint64_t prefetched_hash(const char* key) noexcept nogil:
    """The hash of key if it is the next prefetched one (the read's
    commands run in order, so their keys come at increasing addresses);
    else 0, and the check hashes it itself."""
    global PREFETCHED_AT
    if PREFETCHED_N == 0:
        return 0
    while PREFETCHED_AT < PREFETCHED_N and PREFETCHED[PREFETCHED_AT] < key:
        PREFETCHED_AT += 1      # its command did not check it (an error, a split...)
    if PREFETCHED_AT < PREFETCHED_N and PREFETCHED[PREFETCHED_AT] == key:
        PREFETCHED_AT += 1
        return PREFETCHED_HASH[PREFETCHED_AT - 1]
    return 0


cdef inline void forget_prefetched() noexcept nogil:
    global PREFETCHED_N, PREFETCHED_AT
    PREFETCHED_N = PREFETCHED_AT = 0


cdef int scan_check_keys(const char* buf, size_t n, const char** keys,
                         size_t* lens) noexcept nogil:
    """The keys of the CL.CHECKs among the complete commands that begin
    buf, at most PREFETCH_MAX; the scan stops at anything but a RESP
    array (an inline command) and at an incomplete command."""
    cdef int found = 0
    cdef size_t pos = 0
    cdef int64_t count, length, i
    cdef bint check
    while found < PREFETCH_MAX and pos < n and buf[pos] == c'*':
        count = scan_length(buf, n, &pos)
        if count < 2 or count > 16:
            break
        check = False
        for i in range(count):
            if pos >= n or buf[pos] != c'$':
                return found
            length = scan_length(buf, n, &pos)
            if length < 0 or <size_t>length + 2 > n - pos:
                return found
            if i == 0:
                check = length == 8 and is_cl_check(buf + pos)
            elif i == 1 and check:
                keys[found] = buf + pos
                lens[found] = <size_t>length
                found += 1
            pos += <size_t>length + 2
    return found


cdef inline int64_t scan_length(const char* buf, size_t n, size_t* pos) noexcept nogil:
    """The decimal after buf[*pos] ('*' or '$') up to its CRLF, *pos past
    it; -1 if it is not one (or runs past n or 9 digits)."""
    cdef size_t i = pos[0] + 1
    cdef int64_t value = 0
    cdef int digits = 0
    while i < n and c'0' <= buf[i] <= c'9' and digits < 9:
        value = value * 10 + (buf[i] - c'0')
        i += 1
        digits += 1
    if digits == 0 or i + 1 >= n or buf[i] != c'\r' or buf[i + 1] != c'\n':
        return -1
    pos[0] = i + 2
    return value


cdef inline bint is_cl_check(const char* p) noexcept nogil:
    """Whether the 8 bytes at p are CL.CHECK in any case."""
    cdef const char* name = b"cl.check"
    cdef int i
    for i in range(8):
        if (p[i] | 0x20) != name[i]:
            return False
    return True

cdef enum:
    INBUF_KEEP = 65536    # a larger idle input buffer is released
    # A connection's commands are run this many bytes of them per event-loop
    # turn, then the others get theirs: uvloop hands over up to 256 KB per
    # read, and up to 32 reads per turn.  Redis reads 16 KB per turn.
    TURN_BYTES = 16384

# Connection.reply_mode (CLIENT REPLY): SKIP silences the command being
# run; CLIENT REPLY SKIP sets SKIP_NEXT, which becomes SKIP for the next.
cdef enum:
    REPLY_ON = 0
    REPLY_OFF = 1
    REPLY_SKIP = 2
    REPLY_SKIP_NEXT = 3

# A Sliced reply gets this much time per event-loop turn.
SLICE_BUDGET_S = 0.0005
MAXCLIENTS_LOG_SECONDS = 10.0


cdef inline str arg_text(const Arg* a, size_t limit=128):
    cdef size_t n = a.len if a.len < limit else limit
    return PyBytes_FromStringAndSize(a.ptr, n).decode("utf-8", "surrogateescape")



cdef class Command:
    def __init__(self, str name, int arity, flags=(), handler=None, *,
                 int first_key=0, int last_key=0, int key_step=0, int fast=FAST_NONE,
                 subcommands=None, doc=None, acl_categories=(), bint replica_peeks=False,
                 bint when_subscribed=False):
        self.name = name
        self.arity = arity
        self.flags = tuple(flags)
        self.handler = handler
        self.first_key = first_key
        self.last_key = last_key
        self.key_step = key_step
        self.fast = fast
        self.subcommands = {c.name.split("|")[1].encode(): c for c in (subcommands or ())}
        self.doc = dict(doc or {})
        self.acl_categories = tuple(acl_categories)
        self.no_auth = "no-auth" in self.flags
        self.no_multi = "no-multi" in self.flags
        self.is_write = "write" in self.flags
        self.replica_peeks = replica_peeks
        self.when_subscribed = when_subscribed
        self.not_queued = name == "watch"

    cdef bint arity_ok(self, int argc) noexcept:
        if self.arity >= 0:
            return argc == self.arity
        return argc >= -self.arity

    def check_arity(self, int argc):
        return self.arity_ok(argc)

    @property
    def usec(self):
        return self.nsec // 1000

    def reset_stats(self):
        self.calls = self.nsec = self.failed_calls = self.rejected_calls = 0
        memset(self.latency, 0, sizeof(self.latency))

    def record(self, int64_t ns):
        """One finished call that took ns (for calls timed in Python)."""
        record_call(self, ns)

    def latency_buckets(self):
        """Cumulative calls per latency bucket, as Prometheus counts them:
        the i-th is the calls that took at most LATENCY_BOUNDS[i] seconds,
        the last (le="+Inf") all of them."""
        cdef int64_t total = 0
        out = []
        for i in range(LATENCY_BUCKETS):
            total += self.latency[i]
            out.append(total)
        return out

    def __repr__(self):
        return f"<Command {self.name} arity={self.arity}>"


cdef class ServerCore:
    def __init__(self, BucketStore store, RuleEngine rules, dict commands, *, requirepass=None,
                 int64_t max_bulk_len=512 * 1024 * 1024,
                 int64_t max_multibulk_len=1024 * 1024,
                 int64_t query_buffer_limit=1024 * 1024 * 1024,
                 int64_t output_hard_limit=32 * 1024 * 1024,
                 int64_t output_soft_limit=8 * 1024 * 1024,
                 double output_soft_seconds=60.0,
                 int64_t maxclients=10000, app=None, log=None):
        self.store = store
        self.rules = rules
        self.clock = store.clock
        self.commands = commands
        self.requirepass = requirepass
        self.limits.max_bulk_len = max_bulk_len
        self.limits.max_multibulk_len = max_multibulk_len
        self.limits.unauthenticated = False
        self.auth_required = requirepass is not None
        self.query_buffer_limit = query_buffer_limit
        self.output_hard_limit = output_hard_limit
        self.output_soft_limit = output_soft_limit
        self.output_soft_seconds = output_soft_seconds
        self.pubsub_hard_limit = 32 * 1024 * 1024
        self.pubsub_soft_limit = 8 * 1024 * 1024
        self.pubsub_soft_seconds = 60.0
        self.maxclients = maxclients
        self.clients = {}
        self.budget = [self.clients]
        self.handshaking = 0
        self.full_logged_at = -MAXCLIENTS_LOG_SECONDS
        self.error_counts = {}
        self.next_client_id = 1
        self.app = app
        self.log = log or logging.getLogger("fastlimit")
        self.slot_waiters = {}
        self.monitors = {}
        self.watched_keys = {}
        # On by default (hotkeys-top-k, hotkeys-sample: the subsystem sets them).
        self.hotkeys = HotKeys(now_ms=self.clock.now())
        self.hot = &self.hotkeys.t
        rules.track_hot_keys(self.hotkeys)    # named rules' checks, from every front
        # Off until the overload subsystem configures it (shed-threshold).
        self.load_meter = LoadMeter()
        self.load = &self.load_meter.l
        self.held = collections.deque()
        self.pause_waiters = {}

    cpdef bint full(self) except -1:
        """Whether maxclients connections are open, every front's and the
        TLS handshakes together; when so, logs it (at most every
        MAXCLIENTS_LOG_SECONDS)."""
        cdef Py_ssize_t n = self.handshaking
        for connections in self.budget:
            n += len(connections)
        if n < self.maxclients:
            return False
        now = time.monotonic()
        if now - self.full_logged_at >= MAXCLIENTS_LOG_SECONDS:
            self.full_logged_at = now
            self.log.warning("maxclients (%d) reached: new connections are refused "
                             "(RESP, HTTP, gRPC and TLS handshakes count together)",
                             self.maxclients)
        return True

    cpdef bint refuses(self, object transport) except -1:
        """Whether a front's connection_made turns this connection away:
        a TLS one was let in at accept, before its handshake (and is
        counted in handshaking until it ends)."""
        return transport.get_extra_info("sslcontext") is None and self.full()

    # ---- overload: the connections held back while saturated ------------------

    def shed_rules(self, list nums, int asked, int fallback):
        """CL.APPLY's (and /v1/limits/check's) shedding, as check_limit's
        for CL.LIMIT: the shed reply's five numbers when the node sheds
        the check of these rules now, else None."""
        cdef CheckResult r
        if not self.load.level:
            return None
        if not shed_limit(self, self.rules, self.rules.select_ids(nums), asked, fallback, &r):
            return None
        return (r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms)

    def drain_held(self):
        """Serves held-back connections, oldest first, for at most
        FL_LOAD_DRAIN_NS of this loop turn; the rest wait for the next
        turn, after the critical connections' reads of that turn."""
        cdef int64_t start = fl_mono_ns()
        cdef Connection c
        self.drain_scheduled = False
        while self.held:
            c = self.held.popleft()
            c.held_back = False
            fl_load_release(self.load, c.held_bytes, start - c.held_since)
            c.next_turn()
            if fl_mono_ns() - start >= FL_LOAD_DRAIN_NS:
                break
        if self.held and not self.drain_scheduled:
            self.drain_scheduled = True
            asyncio.get_running_loop().call_soon(self.drain_held)

    # ---- Python's way into WATCH (_protocol_multi.pxi) and routing (_protocol_slots.pxi)

    def touch_keys(self, keys):
        touch_watched_keys(self, keys)

    def touch_all_watched(self):
        touch_all_watched_keys(self)

    def set_routing(self, served, shard_of_slot, list moved_to):
        set_slot_routing(self, served, shard_of_slot, moved_to)

    cdef str route_key(self, const char* key, size_t n):
        return slot_route_error(self, key, n)

    def route_error(self, bytes key):
        """The error a command on key gets here in cluster mode (MOVED,
        ASK, TRYAGAIN...), or None where it runs here."""
        return slot_route_error(self, key, len(key))

    def pause_slots(self, mask):
        return pause_served_slots(self, mask)

    def resume_slots(self):
        resume_paused_slots(self)

    def serves_slot(self, int slot):
        return slot_runs_here(self, slot)

    @property
    def slot_waiting_clients(self):
        return len(self.slot_waiters)

    # ---- a takeover's pause: every client at a command boundary -----------------

    def pause_clients(self):
        """From now on no client command runs: what a connection reads
        waits in its buffer (see Connection.wait_for_resume).  Commands
        already read in this turn ran with their read."""
        self.paused = True

    def resume_clients(self):
        """Ends the pause; each waiting connection runs what it read, on
        its own turn."""
        cdef Connection conn
        self.paused = False
        waiters, self.pause_waiters = self.pause_waiters, {}
        loop = asyncio.get_running_loop()
        for conn in waiters.values():
            loop.call_soon(conn.next_turn)

    property max_bulk_len:
        def __get__(self):
            return self.limits.max_bulk_len
        def __set__(self, int64_t v):
            self.limits.max_bulk_len = v

    property max_multibulk_len:
        def __get__(self):
            return self.limits.max_multibulk_len
        def __set__(self, int64_t v):
            self.limits.max_multibulk_len = v


cdef class Connection:
    def __cinit__(self):
        if parser_init(&self.parser) != 0:
            raise MemoryError()
        self.inbuf = NULL

    def __init__(self, ServerCore core):
        self.core = core
        self.proto = 2
        self.priority = FL_PRIO_NORMAL
        acl_set_user(self, core.default_user, not core.auth_required)
        self.created = self.last_interaction = time.monotonic()
        self.addr = self.laddr = ""

    def __dealloc__(self):
        parser_free(&self.parser)
        free(self.inbuf)

    # ---- asyncio protocol callbacks -----------------------------------------

    def connection_made(self, transport):
        cdef ServerCore core = self.core
        self.transport = transport
        self.id = core.next_client_id
        core.next_client_id += 1
        core.total_connections += 1
        self.addr = _format_addr(transport.get_extra_info("peername"))
        self.laddr = _format_addr(transport.get_extra_info("sockname"))
        if core.refuses(transport):
            core.rejected_connections += 1
            transport.write(b"-ERR max number of clients reached\r\n")
            transport.close()
            self.closed = True
            return
        if core.protected_refusal is not None and \
                not is_local_peer(transport.get_extra_info("peername")):
            core.rejected_connections += 1      # protected mode, as Redis counts it
            transport.write(core.protected_refusal)
            transport.close()
            self.closed = True
            return
        core.clients[self.id] = self

    def connection_lost(self, exc):
        self.closed = True
        self.sliced = self.sliced_cmd = None
        self.waits_for_slot = False
        self.waiting_command = None
        self.core.clients.pop(self.id, None)
        if self.replica is not None:
            self.core.app.replication.detach(self)
        if self.subscribed:
            self.core.app.pubsub.forget(self)
        monitor_stop(self)
        unwatch_all(self)
        self.transport = None
        free(self.inbuf)
        self.inbuf = NULL
        self.inlen = self.incap = 0

    def eof_received(self):
        return False

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass

    def data_received(self, bytes data):
        self.read_this_turn += PyBytes_GET_SIZE(data)
        if self.core.paused and self.replica is None and not self.closed:
            if self.append_input(data):
                self.more_input = True
                self.wait_for_resume()
            return
        if self.core.load.level and self.priority < FL_PRIO_CRITICAL \
                and self.replica is None and not self.closed:
            # Saturated: critical connections are read first, this one
            # after them, within drain_held's budget of the turn.
            if self.append_input(data):
                self.more_input = True
                self.hold_input()
                self.hold_back()
            return
        self.receive(data)
        if (self.more_input or self.read_this_turn >= TURN_BYTES) and not self.input_held \
                and not self.closed:
            self.hold_input()
            self.queue_turn()

    def priorities(self, asked):
        """For a check handled in Python (CL.APPLY): (what it asked, at
        most its user's, or FL_PRIO_UNSET; the fallback: its user's, or
        normal), as cl_limit reads them; the connection reads in that
        class from now on."""
        cdef int fallback = ask_priority(self, FL_PRIO_UNSET if asked is None else asked)
        return (FL_PRIO_UNSET if asked is None else fallback), fallback

    def next_turn(self):
        """This connection's next share of the loop: the commands left
        waiting in its buffer, then reading again."""
        self.read_this_turn = 0
        if self.closed:
            return
        if self.core.paused and self.replica is None:
            self.wait_for_resume()
            return
        if self.more_input and self.sliced is None:
            self.more_input = False
            self.process(self.inbuf, self.inlen)
            if self.more_input:
                self.queue_turn()
                return
        self.release_input()

    cdef void queue_turn(self):
        """Its next turn: after the other connections' reads, or while
        saturated (and not critical) behind the connections held back."""
        if self.core.load.level and self.priority < FL_PRIO_CRITICAL:
            self.hold_back()
        else:
            asyncio.get_running_loop().call_soon(self.next_turn)

    cdef void hold_back(self):
        cdef ServerCore core = self.core
        if self.held_back:
            return
        self.held_back = True
        self.held_since = fl_mono_ns()
        self.held_bytes = self.inlen
        fl_load_hold(core.load, self.held_bytes)
        core.held.append(self)
        if not core.drain_scheduled:
            core.drain_scheduled = True
            asyncio.get_running_loop().call_soon(core.drain_held)

    cdef void wait_for_resume(self):
        """Paused (ServerCore.pause_clients): reads nothing more and runs
        nothing until resume_clients() gives it its next turn."""
        self.hold_input()
        self.core.pause_waiters[self.id] = self

    cdef void hold_input(self):
        self.input_held = True
        if self.transport is not None:
            self.transport.pause_reading()

    def release_input(self):
        """Reads again, unless a sliced reply still holds the input."""
        if self.input_held and self.sliced is None and not self.closed \
                and self.transport is not None:
            self.input_held = False
            self.transport.resume_reading()

    cdef void receive(self, bytes data):
        if self.closed:
            return
        if self.inlen == 0:
            self.core.net_input_bytes += PyBytes_GET_SIZE(data)
            self.process(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
            return
        if not self.append_input(data):
            return
        if self.inlen < self.parser.need:
            self.check_query_buffer(self.inlen)
            return
        # Parse from a private copy of the pointer: process() rewrites inbuf.
        self.process(self.inbuf, self.inlen)

    cdef bint append_input(self, bytes data):
        """data after what waits in inbuf; False when there was no memory
        for it (the connection is closed)."""
        cdef size_t n = PyBytes_GET_SIZE(data)
        cdef char* grown
        cdef size_t cap
        self.core.net_input_bytes += n
        if self.inlen + n > self.incap:
            cap = max(self.incap * 2, self.inlen + n)
            grown = <char*>realloc(self.inbuf, cap)
            if grown == NULL:
                self.core.log.error("client id=%d: out of memory for its query buffer", self.id)
                self.abort()
                return False
            self.inbuf = grown
            self.incap = cap
        memcpy(self.inbuf + self.inlen, PyBytes_AS_STRING(data), n)
        self.inlen += n
        return True

    # ---- parsing and dispatch -----------------------------------------------

    cdef void process(self, const char* buf, size_t n):
        """Runs every complete command in buf[0:n], sends the replies,
        and keeps the incomplete tail for the next read.  Whatever goes
        wrong, the shared reply buffer is left empty: one client's bytes
        must never reach another."""
        self.busy = True
        try:
            self.run_commands(buf, n)
            self.busy = False
            self.flush()
            if self.sliced is not None and not self.closed:
                self.hold_input()
                if not self.waits_for_slot:
                    asyncio.get_running_loop().call_soon(self.run_slices)
        except Exception:
            self.core.log.exception("client id=%d addr=%s: internal error; closing it",
                                    self.id, self.addr)
            self.abort()
        finally:
            writer_reset(&OUT)
            forget_prefetched()
            self.busy = False

    def run_slices(self):
        """One turn of a sliced reply; once it is sent, the commands that
        arrived after it run."""
        cdef Command cmd = self.sliced_cmd
        cdef int64_t started = fl_mono_ns()
        if self.sliced is None or self.closed or self.transport is None:
            return
        self.busy = True
        try:
            if not self.sliced.advance(SLICE_BUDGET_S):
                if type(self.sliced) is Sliced:    # an Awaited one wakes this when done
                    asyncio.get_running_loop().call_soon(self.run_slices)
                return
            reply, self.sliced, self.sliced_cmd = self.sliced.reply, None, None
            if not self.sliced_silent:
                encode_reply(&OUT, reply, self.proto)
        except ReplyError as e:
            self.sliced = self.sliced_cmd = None
            writer_reset(&OUT)
            cmd.failed_calls += 1
            self.reply_error(str(e))
        except Exception:
            self.sliced = self.sliced_cmd = None
            writer_reset(&OUT)
            cmd.failed_calls += 1
            self.core.log.exception("command %s failed", cmd.name)
            self.reply_error(f"ERR internal error while running '{cmd.name}'")
        finally:
            self.sliced_ns += fl_mono_ns() - started
            if self.sliced is None:     # its reply is made: the call is over
                record_call(cmd, self.sliced_ns)
                if self.sliced_silent:  # CLIENT REPLY OFF or SKIP: its error too
                    self.sliced_silent = False
                    writer_reset(&OUT)
            self.busy = False
        try:
            self.flush()
        finally:
            writer_reset(&OUT)
        self.more_input = self.inlen > 0
        self.next_turn()

    cdef void run_commands(self, const char* buf, size_t n):
        cdef size_t pos = 0, used = 0
        cdef int status
        cdef ParseLimits lim = self.core.limits
        cdef int64_t t_prev, t_now, ran_before
        lim.unauthenticated = not self.authenticated
        self.batch_len = n
        if table_is_large(&self.core.store.table):
            prefetch_checks(&self.core.store.table, buf, n if n < TURN_BYTES else TURN_BYTES)
        self.now_ms = self.core.clock.now_ms()
        t_prev = fl_mono_ns()
        self.last_interaction = t_prev / 1e9   # CLOCK_MONOTONIC, as time.monotonic()
        while pos < n and not self.close_after_reply:
            status = parse_command(&self.parser, buf + pos, n - pos, &used, &lim)
            if status == PARSE_INCOMPLETE:
                break   # parser.need counts from pos: the tail kept below
            if status == PARSE_ERROR:
                self.protocol_error()
                break
            if status == PARSE_COMMAND:
                ran_before = self.core.total_commands
                if self.reply_mode == REPLY_ON:
                    self.execute()
                else:
                    self.execute_silenced()
                if not self.authenticated:
                    lim.unauthenticated = True
                elif lim.unauthenticated:
                    lim.unauthenticated = False
                t_now = fl_mono_ns()
                if self.core.total_commands != ran_before:   # it ran (not refused or queued)
                    if self.sliced is None:
                        record_call(self.last_cmd, t_now - t_prev)
                    else:
                        self.sliced_ns = t_now - t_prev     # run_slices records it
                t_prev = t_now
            pos += used
            if self.sliced is not None:
                break    # its reply comes first: the rest waits in the buffer
            if pos >= TURN_BYTES and pos < n:
                self.more_input = True
                break    # the rest waits for this connection's next turn
        parser_release(&self.parser)
        forget_prefetched()     # its keys point into buf (and process() on an error)
        if self.close_after_reply or pos >= n:
            self.inlen = 0
            self.parser.need = 0
            if self.incap > INBUF_KEEP:
                free(self.inbuf)
                self.inbuf = NULL
                self.incap = 0
        else:
            self.keep_tail(buf + pos, n - pos)

    cdef void protocol_error(self):
        """Answers as Redis does and closes.  Logged at verbose, as Redis
        logs it: at the default level a client could grow the log at
        network speed.  The counter keeps the count instead."""
        self.core.protocol_errors += 1
        if self.replica is None:     # never a reply inside the replication stream
            self.reply_error(self.parser.error.decode("utf-8", "surrogateescape"))
        self.core.log.log(LOG_VERBOSE, "client id=%d addr=%s: %s; closing", self.id,
                          self.addr, (<bytes>self.parser.error).decode("latin-1")
                          .encode("unicode_escape").decode("ascii"))
        self.close_after_reply = True

    cdef void keep_tail(self, const char* buf, size_t n):
        cdef char* grown
        if buf == self.inbuf:
            pass     # a command still arriving, already in place: nothing to copy
        elif self.inbuf != NULL and self.inbuf <= buf < self.inbuf + self.incap:
            memmove(self.inbuf, buf, n)
        else:
            if n > self.incap:
                grown = <char*>realloc(self.inbuf, n)
                if grown == NULL:
                    self.core.log.error("client id=%d: out of memory for its query buffer",
                                        self.id)
                    self.abort()
                    return
                self.inbuf = grown
                self.incap = n
            memcpy(self.inbuf, buf, n)
        self.inlen = n
        self.check_query_buffer(n)

    cdef int check_query_buffer(self, size_t n) except -1:
        if <int64_t>n > self.core.query_buffer_limit:
            self.core.log.warning(
                "closing client id=%d addr=%s that reached max query buffer length (%d bytes)",
                self.id, self.addr, n)
            self.abort()
        return 0

    cdef Command lookup(self, const Arg* a):
        """The command named by a, via a one-entry cache: pipelines mostly
        repeat one command."""
        cdef char lower[32]
        cdef size_t i
        cdef char c
        cdef Command cmd
        if a.len == 0 or a.len > sizeof(lower):
            return None
        for i in range(a.len):
            c = a.ptr[i]
            lower[i] = c + 32 if c'A' <= c <= c'Z' else c
        if self.last_cmd is not None and a.len == self.last_name_len:
            for i in range(a.len):
                if lower[i] != self.last_name[i]:
                    break
            else:
                return self.last_cmd
        cmd = self.core.commands.get(PyBytes_FromStringAndSize(lower, a.len))
        if cmd is not None:
            memcpy(self.last_name, lower, a.len)
            self.last_name_len = a.len
            self.last_cmd = cmd
        return cmd

    cdef void execute(self):
        """Checks and runs (or queues) the command in parser.argv."""
        cdef Arg* argv = self.parser.argv
        cdef int argc = self.parser.argc
        cdef Command cmd = self.lookup(&argv[0])
        if self.replica is not None:
            self.on_replica_link(cmd)
        elif cmd is None:
            self.last_cmd = None
            self.reject(None, unknown_command_message(argv, argc))
        elif not cmd.arity_ok(argc):
            self.reject(cmd, f"ERR wrong number of arguments for '{cmd.name}' command")
        elif not self.authenticated and not cmd.no_auth:
            self.reject(cmd, "NOAUTH Authentication required.")
        elif self.restricted and acl_denied(self, cmd, False):
            pass
        elif self.core.cluster_routing and cmd.first_key and not serves_key(self, cmd):
            redirect(self, cmd)
        elif self.core.readonly and cmd.is_write and (
                not cmd.replica_peeks or self.multi_queue is not None and queued_write(self, cmd)):
            self.reject(cmd, READONLY_ERROR)
        elif self.multi_queue is not None and cmd.no_multi:
            self.reject(cmd, "ERR Command not allowed inside a transaction")
        elif self.subscribed and self.proto == 2 and not cmd.when_subscribed:
            self.refuse_when_subscribed(cmd)
        elif self.multi_queue is not None and cmd.fast < FAST_MULTI:
            queue_in_multi(self, cmd)
        else:
            self.run(cmd, None)

    cdef void execute_silenced(self):
        """execute() under CLIENT REPLY OFF or SKIP, as Redis silences
        replies: the command's replies are dropped, but not the pushes it
        causes (its subscriptions' confirmations, messages to itself), and
        CLIENT REPLY ON's own OK goes out."""
        cdef size_t mark = OUT.len
        cdef int before = self.reply_mode
        cdef bytes frame
        if before == REPLY_SKIP_NEXT:
            before = self.reply_mode = REPLY_SKIP
        self.silent_pushes = []
        try:
            self.execute()
        finally:
            pushes, self.silent_pushes = self.silent_pushes, None
        if self.reply_mode == REPLY_OFF or (before == REPLY_SKIP and self.reply_mode != REPLY_ON):
            OUT.len = mark
            for frame in pushes:
                if write_raw(&OUT, PyBytes_AS_STRING(frame), PyBytes_GET_SIZE(frame)) != 0:
                    raise MemoryError()
            if self.sliced is not None:
                self.sliced_silent = True
        if before == REPLY_SKIP and self.reply_mode == REPLY_SKIP:
            self.reply_mode = REPLY_ON       # the skipped command is done

    cdef void on_replica_link(self, Command cmd):
        """After CL.SYNC the connection carries the replication stream out
        and only REPLCONF ACKs in.  Anything else is refused as Redis
        refuses it ("Replica can't interact with the keyspace"), but with
        no reply, which would corrupt the stream: one warning, and the
        link is closed before it runs.  A REPLCONF passes the user's ACL as
        any command does: one its rules no longer admit is in ACL LOG, and
        the link closes."""
        cdef size_t mark = OUT.len
        if cmd is not None and cmd.name == "replconf" and not (
                self.restricted and acl_denied(self, cmd, False)):
            self.run(cmd, None)
            if OUT.len == mark:
                return
        OUT.len = mark     # neither a refusal nor a REPLCONF that answers is an ACK
        self.core.log.warning("replica id=%d addr=%s sent %s, which a replication link "
                              "does not take; closing the link", self.id, self.addr,
                              ascii(arg_text(&self.parser.argv[0], 32)))
        self.close_after_reply = True

    cdef void refuse_when_subscribed(self, Command cmd):
        """A subscribed RESP2 connection reads pushes, not replies: Redis
        refuses all but a few commands there, naming the subcommand as
        its table does (an unknown subcommand, or one with the wrong
        arity, runs instead, for the container's own error)."""
        cdef Command sub
        cdef str name = cmd.name
        if cmd.subcommands and self.parser.argc >= 2:
            sub = cmd.subcommands.get(PyBytes_FromStringAndSize(
                self.parser.argv[1].ptr, self.parser.argv[1].len).lower())
            if sub is None or not sub.arity_ok(self.parser.argc):
                self.run(cmd, None)
                return
            name = sub.name
        self.reject(cmd, f"ERR Can't execute '{name}': only (P|S)SUBSCRIBE / "
                         "(P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context")

    cdef void reject(self, Command cmd, str msg):
        """Refuses a command before it runs; inside MULTI that dooms the
        transaction (EXECABORT), as in Redis."""
        if cmd is not None:
            cmd.rejected_calls += 1
        self.reply_error(msg)
        if self.multi_queue is not None:
            self.multi_dirty = True

    cdef void run(self, Command cmd, list args):
        """Runs a checked command; args are given when it was queued,
        otherwise parser.argv holds them.  Its caller records the call.
        While nobody monitors or watches, that costs one test of a C int."""
        self.core.total_commands += 1
        if self.core.observers:
            run_observed(self, cmd, args)
        else:
            self.dispatch(cmd, args)

    cdef int dispatch(self, Command cmd, list args) except -1:
        # An int, not a void: its caller tests the -1, not PyErr_Occurred(),
        # on the path of every check.
        if cmd.fast == FAST_CL_CHECK:
            cl_check(self)
        elif cmd.fast == FAST_CL_LIMIT:
            cl_limit(self)
        elif cmd.fast == FAST_PING:
            ping(self)
        elif cmd.fast == FAST_MULTI:
            begin_multi(self)
        elif cmd.fast == FAST_EXEC:
            exec_queued(self)
        elif cmd.fast == FAST_DISCARD:
            discard_multi(self)
        else:
            self.run_python(cmd, args)
        return 0

    cdef list args_as_bytes(self):
        cdef int i
        return [PyBytes_FromStringAndSize(self.parser.argv[i].ptr, self.parser.argv[i].len)
                for i in range(self.parser.argc)]

    cdef void run_python(self, Command cmd, list args):
        cdef size_t mark = OUT.len
        cdef bint queued = args is not None
        try:
            reply = cmd.handler(self, args if queued else self.args_as_bytes())
            # Python commands may move the manual clock (DEBUG CLOCK) for
            # the commands after them in this read.
            self.now_ms = self.core.clock.now_ms()
            if type(reply) is Sliced or type(reply) is Awaited:
                if queued or not self.may_slice():
                    reply = reply.finish()     # EXEC runs as one
                else:
                    self.sliced, self.sliced_cmd = reply, cmd
                    if type(reply) is Awaited:
                        reply.begin(self.run_slices)
                    return
            encode_reply(&OUT, reply, self.proto)
        except ReplyError as e:
            OUT.len = mark
            cmd.failed_calls += 1
            self.reply_error(str(e))
        except Exception:
            OUT.len = mark
            cmd.failed_calls += 1
            self.core.log.exception("command %s failed", cmd.name)
            self.reply_error(f"ERR internal error while running '{cmd.name}'")

    cdef bint may_slice(self):
        """A sliced reply needs an event loop to come back on (a test
        double of a transport may run without one)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return self.transport is not None

    cdef void reply_error(self, str msg):
        cdef bytes b = msg.encode("utf-8", "surrogateescape")
        cdef str code = msg.partition(" ")[0]
        cdef dict counts = self.core.error_counts
        self.core.total_error_replies += 1
        counts[code] = counts.get(code, 0) + 1
        write_line(&OUT, c'-', PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))

    # ---- output ----------------------------------------------------------------

    cdef void flush(self):
        cdef bytes data
        if self.transport is None or self.closed:
            writer_reset(&OUT)
            return
        if OUT.len > 0:
            data = PyBytes_FromStringAndSize(OUT.buf, OUT.len)
            self.core.net_output_bytes += OUT.len
            writer_reset(&OUT)
            self.transport.write(data)
        if self.close_after_reply:
            self.closed = True
            self.transport.close()
            return
        self.check_output_limits()

    cdef void check_output_limits(self):
        """Drops a client whose unsent output is past its class's limits:
        a subscriber has the pubsub class (as Redis's getClientType)."""
        cdef ServerCore core = self.core
        cdef int64_t pending = self.transport.get_write_buffer_size()
        if self.replica is not None:
            core.app.replication.check_output(self)   # the stream's own bound
            return
        if pending == 0:
            self.soft_limit_since = 0
        elif self.subscribed:
            self.over_output_limits(pending, core.pubsub_hard_limit, core.pubsub_soft_limit,
                                    core.pubsub_soft_seconds)
        else:
            self.over_output_limits(pending, core.output_hard_limit, core.output_soft_limit,
                                    core.output_soft_seconds)

    cdef void over_output_limits(self, int64_t pending, int64_t hard, int64_t soft,
                                 double soft_seconds):
        cdef double now
        cdef str kind = "subscriber" if self.subscribed else "client"
        if hard > 0 and pending > hard:
            self.core.log.warning("closing %s id=%d addr=%s: output buffer %d bytes "
                                  "over the hard limit", kind, self.id, self.addr, pending)
            self.abort()
            return
        if soft > 0 and pending > soft:
            now = time.monotonic()
            if self.soft_limit_since == 0:
                self.soft_limit_since = now
            elif now - self.soft_limit_since > soft_seconds:
                self.core.log.warning("closing %s id=%d addr=%s: output buffer over the "
                                      "soft limit for %.0f s", kind, self.id, self.addr,
                                      now - self.soft_limit_since)
                self.abort()
        else:
            self.soft_limit_since = 0

    # ---- used by the event-loop layer and by command handlers -----------------

    def abort(self):
        """Drops the connection now, with whatever output is pending."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self):
        """Closes after the pending output is sent; a connection closed by
        one of its own commands first gets that command's reply.  Its
        subscriptions go at once: a subscriber that does not read may
        take long to close (as in Redis, CLIENT KILL ends them now)."""
        if self.subscribed:
            self.core.app.pubsub.forget(self)
        if self.busy:
            self.close_after_reply = True
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, bytes data):
        """Writes outside a command's reply (the replication stream)."""
        if self.transport is not None and not self.closed:
            self.core.net_output_bytes += len(data)
            self.transport.write(data)

    def push(self, bytes frame):
        """A pub/sub frame for this client: into the replies being made
        when it is the client running a command (its own confirmations,
        or a message it published to itself, which comes before PUBLISH's
        reply), otherwise written at once, never waiting for the client
        to read: past its output limits it is dropped instead.  Whether
        the client is still connected after it."""
        if self.busy:
            if self.silent_pushes is not None:   # its replies are silenced, not its pushes
                self.silent_pushes.append(frame)
                return True
            if write_raw(&OUT, PyBytes_AS_STRING(frame), PyBytes_GET_SIZE(frame)) != 0:
                raise MemoryError()
            return True
        if self.transport is None or self.closed:
            return False
        self.core.net_output_bytes += PyBytes_GET_SIZE(frame)
        self.transport.write(frame)
        self.check_output_limits()
        return not self.closed

    def cron(self):
        """Periodic checks for a connection that may have gone quiet."""
        if self.transport is not None and not self.closed:
            self.check_output_limits()

    def set_user(self, user, bint authenticated):
        acl_set_user(self, user, authenticated)           # _protocol_acl.pxi

    def start_monitor(self):
        monitor_start(self)                               # _protocol_observe.pxi

    def stop_monitor(self):
        monitor_stop(self)

    def watch(self, keys):
        watch_keys(self, keys)                            # _protocol_multi.pxi

    def unwatch(self):
        unwatch_all(self)

    # ---- a takeover passes the connection to the new process (takeover/) -----------

    @property
    def reply_pending(self):
        """A sliced or awaited reply is being made: the connection is not
        at a command boundary."""
        return self.sliced is not None

    def export_state(self):
        """Every setting a client made on this connection, its
        subscriptions and the bytes it sent that did not run (from a
        command boundary on: the pause keeps them unread), for the process
        taking over (takeover/wire.py encodes them); restore_state()
        there.  A field a client can set is added here and there."""
        return {"proto": self.proto, "authenticated": self.authenticated,
                "user": self.user.name if self.user is not None else None,
                "name": self.name, "lib_name": self.lib_name, "lib_ver": self.lib_ver,
                "reply_mode": self.reply_mode, "priority": self.priority,
                "channels": list(self.pubsub_channels or ()),
                "patterns": list(self.pubsub_patterns or ()),
                "input": PyBytes_FromStringAndSize(self.inbuf, self.inlen)}

    def restore_state(self, dict state, user):
        """export_state()'s state on a new connection, before it is made
        (user: the ACL user of that name here); its input runs on its
        first turn (next_turn), before what it reads.  The subscriptions
        are the pub/sub subsystem's to restore (PubSub.restore)."""
        acl_set_user(self, user, state["authenticated"])
        self.priority = state["priority"]
        self.proto = state["proto"]
        self.name, self.lib_name, self.lib_ver = \
            state["name"], state["lib_name"], state["lib_ver"]
        self.reply_mode = state["reply_mode"]
        if state["input"] and self.append_input(state["input"]):
            self.more_input = True

    # ---- what CLIENT LIST and INFO show ------------------------------------------

    @property
    def is_closed(self):
        """Closed, or closing once its last replies are sent."""
        return self.closed or self.close_after_reply

    @property
    def query_buffer_len(self):
        """CLIENT LIST's qbuf: as Redis's querybuf, while its commands run
        the whole read they came in (the one running included), else the
        unparsed tail."""
        return self.batch_len if self.busy else self.inlen

    @property
    def query_buffer_free(self):
        """qbuf-free: what the held buffer has room for beyond qbuf."""
        return max(<int64_t>self.incap - <int64_t>self.query_buffer_len, 0) \
            if self.inbuf != NULL else 0

    @property
    def argv_memory(self):
        """argv-mem: the bytes of the running command's arguments (none
        between commands, as Redis frees them)."""
        cdef int i
        cdef size_t total = 0
        if not self.busy:
            return 0
        for i in range(self.parser.argc):
            total += self.parser.argv[i].len
        return total

    @property
    def multi_memory(self):
        """multi-mem: the bytes of the commands queued in MULTI."""
        if self.multi_queue is None:
            return 0
        return sum(len(a) for _, args in self.multi_queue for a in args)

    @property
    def input_memory(self):
        """Bytes held for reading this client: the query buffer and the
        parser's argument arrays."""
        return self.incap + parser_memory(&self.parser)

    @property
    def output_buffer_len(self):
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    @property
    def watched_count(self):
        return len(self.watching) if self.watching is not None else 0

    @property
    def in_multi(self):
        return self.multi_queue is not None

    @property
    def last_command(self):
        if self.last_cmd is None:
            return "NULL"
        if self.last_cmd.subcommands and self.last_subcommand:
            return self.last_subcommand
        return self.last_cmd.name


READONLY_ERROR = "READONLY You can't write against a read only replica."
# The upper bounds, in seconds, of Command.latency_buckets() but the last (+Inf).
LATENCY_BOUNDS = tuple(FL_LATENCY_BOUNDS_NS[i] / 1e9 for i in range(LATENCY_BUCKETS - 1))
LOG_VERBOSE = 15     # the "verbose" loglevel (server/config/values.py LOGLEVELS)


cdef str unknown_command_message(const Arg* argv, int argc):
    # Redis: ERR unknown command 'x', with args beginning with: 'a' 'b'
    # (the quoted list stops once it reaches 128 characters)
    cdef int i = 1
    cdef str args = ""
    while i < argc and len(args) < 128:
        args += f"'{arg_text(&argv[i], 128 - len(args))}' "
        i += 1
    return f"ERR unknown command '{arg_text(&argv[0])}', with args beginning with: {args}"


def is_local_peer(peername):
    """Redis's islocalClient: a Unix socket, or a TCP peer whose address is
    exactly 127.0.0.1 or ::1 (not 127.0.0.2, not ::ffff:127.0.0.1)."""
    if not isinstance(peername, tuple):
        return True
    return peername[0] in ("127.0.0.1", "::1")


def _format_addr(addr):
    if not addr:
        return ""
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr)


# ---- Connection's concerns, a file each (their functions are declared in _protocol.pxd) ----

include "_protocol_checks.pxi"     # CL.CHECK, CL.LIMIT, PING; the decisions every front shares
include "_protocol_multi.pxi"      # MULTI, EXEC, DISCARD, WATCH
include "_protocol_acl.pxi"        # the authorization gate, for every front
include "_protocol_slots.pxi"      # cluster routing: redirects, paused slots
include "_protocol_observe.pxi"    # MONITOR, and telling WATCH of the writes
include "_protocol_glob.pxi"       # Redis's glob
