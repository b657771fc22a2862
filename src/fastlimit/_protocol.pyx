"""The per-connection protocol state machine; see _protocol.pxd."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, realloc, free
from cpython.ref cimport PyObject
from libc.string cimport memcmp, memcpy, memmove, memset

from fastlimit._cluster cimport key_slot
from fastlimit._rules cimport RuleEngine
from fastlimit._core cimport (BucketParams, CheckResult, bucket_check, MAX_CAPACITY,
                              bucket_params_error, fl_mono_ns, FL_OK, FL_EKEYLEN,
                              FL_EOOM)
from fastlimit._core import OOM_ERROR
from fastlimit._resp cimport (Parser, ParseLimits, Arg, Writer, parser_init,
                              parser_free, parser_reserve, parser_release,
                              parser_memory, parse_command,
                              parse_int64, writer_init, writer_reset, write_raw,
                              write_prefixed_int, write_bulk, write_line,
                              encode_reply, PARSE_COMMAND,
                              PARSE_EMPTY, PARSE_ERROR, PARSE_INCOMPLETE)

import asyncio
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

# ServerCore.slot_served values.
cdef enum:
    SLOT_NOT_SERVED = 0
    SLOT_SERVED = 1
    SLOT_PAUSED = 2

# Connection.sliced while its next command waits for a paused slot: like a
# sliced reply, it holds the input and the commands after it.
SLOT_WAIT = object()


cdef inline bint eq_nocase(const Arg* a, const char* lower, size_t n) noexcept:
    cdef size_t i
    cdef char c
    if a.len != n:
        return False
    for i in range(n):
        c = a.ptr[i]
        if c'A' <= c <= c'Z':
            c = c + 32
        if c != lower[i]:
            return False
    return True


cdef inline str arg_text(const Arg* a, size_t limit=128):
    cdef size_t n = a.len if a.len < limit else limit
    return PyBytes_FromStringAndSize(a.ptr, n).decode("utf-8", "surrogateescape")


cdef enum OptionStatus:
    OPT_OK = 0
    OPT_NEEDS_VALUE = 1
    OPT_UNKNOWN = 2
    OPT_BAD_CAPACITY = 3
    OPT_BAD_REFILL = 4
    OPT_BAD_COST = 5
    OPT_BAD_PERIOD = 6
    OPT_BAD_LIMIT_COST = 7


cdef struct LimitArgs:
    const char* tier
    size_t tlen
    int64_t cost
    bint detail


cdef int read_check_args(const Arg* a, int argc, BucketParams* bp, int* bad) noexcept:
    """CL.CHECK's numbers and options into bp: OPT_OK, or what is wrong
    (with the option at a[*bad])."""
    cdef int i = 4
    bp.cost = 1
    bp.period_ms = 1000
    if not parse_int64(a[2].ptr, a[2].len, &bp.capacity):
        return OPT_BAD_CAPACITY
    if not parse_int64(a[3].ptr, a[3].len, &bp.refill):
        return OPT_BAD_REFILL
    while i < argc:
        bad[0] = i
        if i + 1 >= argc:
            return OPT_NEEDS_VALUE
        if eq_nocase(&a[i], b"cost", 4):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &bp.cost):
                return OPT_BAD_COST
        elif eq_nocase(&a[i], b"period", 6):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &bp.period_ms):
                return OPT_BAD_PERIOD
        else:
            return OPT_UNKNOWN
        i += 2
    return OPT_OK


cdef int read_limit_args(const Arg* a, int argc, LimitArgs* la, int* bad) noexcept:
    """CL.LIMIT's options into la, as read_check_args."""
    cdef int i = 3
    la.tier = NULL
    la.tlen = 0
    la.cost = 1
    la.detail = False
    while i < argc:
        bad[0] = i
        if eq_nocase(&a[i], b"detail", 6):
            la.detail = True
            i += 1
            continue
        if i + 1 >= argc:
            return OPT_NEEDS_VALUE
        if eq_nocase(&a[i], b"tier", 4):
            la.tier, la.tlen = a[i + 1].ptr, a[i + 1].len
        elif eq_nocase(&a[i], b"cost", 4):
            if not parse_int64(a[i + 1].ptr, a[i + 1].len, &la.cost) or la.cost < 0 \
                    or la.cost > MAX_CAPACITY:
                return OPT_BAD_LIMIT_COST
        else:
            return OPT_UNKNOWN
        i += 2
    return OPT_OK


cdef str options_error(int status, const Arg* option, str expected):
    if status == OPT_BAD_CAPACITY:
        return "ERR capacity is not an integer or out of range"
    if status == OPT_BAD_REFILL:
        return "ERR refill_per_sec is not an integer or out of range"
    if status == OPT_BAD_COST:
        return "ERR COST is not an integer or out of range"
    if status == OPT_BAD_PERIOD:
        return "ERR PERIOD is not an integer or out of range"
    if status == OPT_BAD_LIMIT_COST:
        return "ERR COST must be an integer from 0 to 10^15"
    if status == OPT_NEEDS_VALUE:
        return f"ERR syntax error: option '{arg_text(option)}' needs a value"
    return f"ERR syntax error: unknown option '{arg_text(option)}', expected {expected}"


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

    def touch_keys(self, keys):
        """WATCH: the buckets named by keys changed; their watchers' EXEC
        will abort."""
        cdef Connection c
        for key in keys:
            watchers = self.watched_keys.get(key)
            if watchers:
                for c in watchers.values():
                    c.watch_dirty = True

    def touch_all_watched(self):
        """WATCH: every watched bucket changed (FLUSHALL).  An absent
        bucket reads as a full one, so each watched key counts as touched."""
        self.touch_keys(list(self.watched_keys))

    def set_routing(self, served, shard_of_slot, list moved_to):
        """Cluster routing: served[slot] is true where this node serves the
        slot as primary, shard_of_slot[slot] the slot's shard index (both
        of CLUSTER_SLOTS entries), moved_to the redirect target per shard.
        None for all three turns routing off (standalone)."""
        cdef int slot
        if moved_to is None:
            self.cluster_routing = False
            self.moved_to = None
            return
        if len(served) != CLUSTER_SLOTS or len(shard_of_slot) != CLUSTER_SLOTS:
            raise ValueError(f"routing needs {CLUSTER_SLOTS} entries per slot")
        for slot in range(CLUSTER_SLOTS):
            if not 0 <= shard_of_slot[slot] < len(moved_to):
                raise ValueError(f"slot {slot}: no shard {shard_of_slot[slot]}")
        for slot in range(CLUSTER_SLOTS):
            # A pause outlives a routing change for the slots still served.
            self.slot_served[slot] = SLOT_NOT_SERVED if not served[slot] else (
                SLOT_PAUSED if self.slot_served[slot] == SLOT_PAUSED else SLOT_SERVED)
            self.slot_shard[slot] = shard_of_slot[slot]
        self.moved_to = list(moved_to)
        self.cluster_routing = True

    cdef str route_key(self, const char* key, size_t n):
        """In cluster mode, None when this node serves the key's slot as
        primary, else the error a client is redirected with: MOVED,
        CLUSTERDOWN, or TRYAGAIN while the slot is paused (a front that
        cannot hold a request, as RESP does, asks the client to retry)."""
        cdef int slot
        if not self.cluster_routing:
            return None
        slot = key_slot(key, n)
        if self.slot_served[slot] == SLOT_SERVED:
            return None
        if self.slot_served[slot] == SLOT_PAUSED:
            return "TRYAGAIN the slot is moving to another shard"
        target = self.moved_to[self.slot_shard[slot]]
        return "CLUSTERDOWN Hash slot not served" if target is None else f"MOVED {slot} {target}"

    def pause_slots(self, mask):
        """Commands on the served slots set in mask (CLUSTER_SLOTS bytes)
        wait from now until resume_slots(); returns how many were paused."""
        cdef int slot, paused = 0
        if not self.cluster_routing or len(mask) != CLUSTER_SLOTS:
            raise ValueError("pausing slots needs cluster routing and a slot mask")
        for slot in range(CLUSTER_SLOTS):
            if mask[slot] and self.slot_served[slot] == SLOT_SERVED:
                self.slot_served[slot] = SLOT_PAUSED
                paused += 1
        return paused

    def resume_slots(self):
        """Ends every pause; the waiting commands run (or are redirected,
        if their slot moved meanwhile), each connection on its own turn."""
        cdef int slot
        cdef Connection conn
        for slot in range(CLUSTER_SLOTS):
            if self.slot_served[slot] == SLOT_PAUSED:
                self.slot_served[slot] = SLOT_SERVED
        waiters, self.slot_waiters = self.slot_waiters, {}
        loop = asyncio.get_running_loop()
        for conn in waiters.values():
            if conn.waits_for_slot and conn.requeue_waiting():
                loop.call_soon(conn.next_turn)

    @property
    def slot_waiting_clients(self):
        return len(self.slot_waiters)

    def serves_slot(self, int slot):
        """Whether a keyed command for slot runs here (always, standalone)."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError("slot out of range")
        return not self.cluster_routing or bool(self.slot_served[slot])

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
        self.set_user(core.default_user, not core.auth_required)
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
        self.stop_monitor()
        self.unwatch()
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
        self.receive(data)
        if (self.more_input or self.read_this_turn >= TURN_BYTES) and not self.input_held \
                and not self.closed:
            self.hold_input()
            asyncio.get_running_loop().call_soon(self.next_turn)

    def next_turn(self):
        """This connection's next share of the loop: the commands left
        waiting in its buffer, then reading again."""
        self.read_this_turn = 0
        if self.closed:
            return
        if self.more_input and self.sliced is None:
            self.more_input = False
            self.process(self.inbuf, self.inlen)
            if self.more_input:
                asyncio.get_running_loop().call_soon(self.next_turn)
                return
        self.release_input()

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
        cdef size_t n = PyBytes_GET_SIZE(data)
        cdef char* grown
        cdef size_t cap
        if self.closed:
            return
        self.core.net_input_bytes += n
        if self.inlen == 0:
            self.process(PyBytes_AS_STRING(data), n)
            return
        if self.inlen + n > self.incap:
            cap = max(self.incap * 2, self.inlen + n)
            grown = <char*>realloc(self.inbuf, cap)
            if grown == NULL:
                self.core.log.error("client id=%d: out of memory for its query buffer", self.id)
                self.abort()
                return
            self.inbuf = grown
            self.incap = cap
        memcpy(self.inbuf + self.inlen, PyBytes_AS_STRING(data), n)
        self.inlen += n
        if self.inlen < self.parser.need:
            self.check_query_buffer(self.inlen)
            return
        # Parse from a private copy of the pointer: process() rewrites inbuf.
        self.process(self.inbuf, self.inlen)

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
        elif self.restricted and self.acl_denied(cmd, False):
            pass
        elif self.core.cluster_routing and cmd.first_key and not self.serves_key(cmd):
            self.redirect(cmd)
        elif self.core.readonly and cmd.is_write and (
                not cmd.replica_peeks or self.multi_queue is not None and self.queued_write(cmd)):
            self.reject(cmd, READONLY_ERROR)
        elif self.multi_queue is not None and cmd.no_multi:
            self.reject(cmd, "ERR Command not allowed inside a transaction")
        elif self.subscribed and self.proto == 2 and not cmd.when_subscribed:
            self.refuse_when_subscribed(cmd)
        elif self.multi_queue is not None and cmd.fast < FAST_MULTI:
            self.queue(cmd)
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
    cdef bint acl_denied(self, Command cmd, bint at_exec):
        """For a restricted user: refuses (and logs in ACL LOG) the command
        in parser.argv if the user may not run it or touch one of its keys,
        as Redis's ACLCheckAllPerm; a container is judged by its
        subcommand (CONFIG|SET).  at_exec: EXEC running what MULTI queued,
        whose reply is Redis's "rules changed" NOPERM."""
        cdef Command target = cmd
        cdef Command sub
        cdef int pos = 0
        if cmd.no_auth:
            return False     # AUTH, HELLO, QUIT, RESET and CL.PEERAUTH (the table's only no-auth ones), as Redis
        if cmd.subcommands and self.parser.argc >= 2:
            sub = cmd.subcommands.get(PyBytes_FromStringAndSize(
                self.parser.argv[1].ptr, self.parser.argv[1].len).lower())
            if sub is None or not sub.arity_ok(self.parser.argc):
                return False     # the container's own error comes next
            target = sub
        pos = acl_verdict(self.acl_perm, self.acl_keys, target, self.parser.argv,
                          self.parser.argc)
        reason = "key"
        if pos == 0 and target.has_channels and self.acl_channels is not None:
            pos = self.core.app.acl.channel_position(self.acl_channels, target,
                                                     self.args_as_bytes())
            reason = "channel"
        if pos == 0:
            return False
        if pos < 0:
            reason, obj = "command", target.name
        else:
            obj = arg_text(&self.parser.argv[pos], 1 << 30)
        self.core.app.acl.log_denial(self, reason, obj, at_exec or self.multi_queue is not None)
        if at_exec:
            self.reply_error("NOPERM ACLs rules changed between the moment the transaction was "
                             "accumulated and the EXEC call. This command is no longer allowed "
                             "for the following reason: " + EXEC_DENIALS[reason])
        elif pos < 0:
            self.reject(cmd, f"NOPERM this user has no permissions to run the '{target.name}' "
                             "command")
        else:
            self.reject(cmd, f"NOPERM this user has no permissions to access one of the "
                             f"{reason}s used as arguments")
        return True

    def set_user(self, user, bint authenticated):
        """Runs as user (server/acl.py's User, or None: unrestricted) from
        now on; its grant is None when it may run everything on every key
        and channel, else (permission map, key patterns or None, channel
        patterns or None)."""
        grant = user.grant if user is not None else None
        self.user = user
        self.authenticated = authenticated
        self.restricted = grant is not None
        self.acl_perm, self.acl_keys, self.acl_channels = \
            grant if grant is not None else (None, None, None)

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
                self.restricted and self.acl_denied(cmd, False)):
            self.run(cmd, None)
            if OUT.len == mark:
                return
        OUT.len = mark     # neither a refusal nor a REPLCONF that answers is an ACK
        self.core.log.warning("replica id=%d addr=%s sent %s, which a replication link "
                              "does not take; closing the link", self.id, self.addr,
                              ascii(arg_text(&self.parser.argv[0], 32)))
        self.close_after_reply = True

    cdef inline bint serves_key(self, Command cmd) noexcept:
        """Whether this node serves the slot of the command's key as primary
        (Redis Cluster's routing, before the command runs or is queued)."""
        cdef const Arg* key
        if cmd.first_key >= self.parser.argc:
            return True
        key = &self.parser.argv[cmd.first_key]
        return self.core.slot_served[key_slot(key.ptr, key.len)] == SLOT_SERVED

    cdef void redirect(self, Command cmd):
        """-MOVED to the primary serving the key's slot (a standby redirects
        too: clients handle MOVED alike, READONLY not), or CLUSTERDOWN when
        the slot's shard has no known primary.  Refused like any command,
        so MULTI fails at EXEC as in Redis.  A paused slot's command waits
        instead (see pause_slots)."""
        cdef const Arg* key = &self.parser.argv[cmd.first_key]
        cdef int slot = key_slot(key.ptr, key.len)
        if self.core.slot_served[slot] == SLOT_PAUSED:
            self.wait_for_slot()
            return
        target = self.core.moved_to[self.core.slot_shard[slot]]
        if target is None:
            self.reject(cmd, "CLUSTERDOWN Hash slot not served")
        else:
            self.reject(cmd, f"MOVED {slot} {target}")

    cdef void wait_for_slot(self):
        """The command just parsed waits for its slot's pause to end: no
        reply; a copy of it (as a multibulk) goes back in front of the
        buffer when the pause ends (requeue_waiting), and what follows it
        waits as after a sliced reply.  All of it off the path of commands
        that run: run_commands is untouched."""
        cdef int i
        cdef const Arg* a
        parts = [b"*%d\r\n" % self.parser.argc]
        for i in range(self.parser.argc):
            a = &self.parser.argv[i]
            parts.append(b"$%d\r\n%s\r\n" % (a.len, a.ptr[:a.len]))
        self.waiting_command = b"".join(parts)
        self.sliced = SLOT_WAIT
        self.waits_for_slot = True
        self.core.slot_waiters[self.id] = self

    cdef bint requeue_waiting(self):
        """Puts the waiting command back before the rest of the buffer;
        False if the connection is closed for want of memory."""
        cdef bytes command = self.waiting_command
        cdef size_t n = PyBytes_GET_SIZE(command)
        cdef char* grown
        self.waiting_command = None
        self.waits_for_slot = False
        self.sliced = None
        if self.inlen + n > self.incap:
            grown = <char*>realloc(self.inbuf, self.inlen + n)
            if grown == NULL:
                self.core.log.error("client id=%d: out of memory for its query buffer", self.id)
                self.abort()
                return False
            self.inbuf = grown
            self.incap = self.inlen + n
        memmove(self.inbuf + n, self.inbuf, self.inlen)
        memcpy(self.inbuf, PyBytes_AS_STRING(command), n)
        self.inlen += n
        self.more_input = True
        return True

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

    cdef bint queued_write(self, Command cmd):
        """Whether a fast command queued in MULTI on a replica would write:
        CL.CHECK and CL.LIMIT with COST 0 are peeks, so they may run.  One
        whose options do not parse is queued, to fail at EXEC, and so is
        a peeking command with a Python handler, which refuses its own
        writes when it runs."""
        cdef BucketParams bp
        cdef LimitArgs la
        cdef int bad
        if cmd.fast == FAST_CL_CHECK:
            return read_check_args(self.parser.argv, self.parser.argc, &bp, &bad) == OPT_OK \
                and bp.cost != 0
        if cmd.fast == FAST_CL_LIMIT:
            return read_limit_args(self.parser.argv, self.parser.argc, &la, &bad) == OPT_OK \
                and la.cost != 0
        return False

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
            self.run_observed(cmd, args)
        else:
            self.dispatch(cmd, args)

    cdef void run_observed(self, Command cmd, list args):
        """run() while some client monitors or watches: after the command,
        the monitors get its line (EXEC's after the commands it ran, as in
        Redis) and the watchers of the keys a write names are told."""
        cdef list seen = args if args is not None else self.args_as_bytes()
        cdef ServerCore core = self.core
        self.dispatch(cmd, args)
        if core.monitors:
            self.feed_monitors(cmd, seen)
        if core.watched_keys and cmd.is_write and cmd.first_key:
            core.touch_keys(command_keys(cmd, seen))

    cdef void feed_monitors(self, Command cmd, list args):
        """Redis's replicationFeedMonitors line, to every monitor; admin
        commands are not shown (nor their subcommands), AUTH and HELLO's
        credentials are redacted.  A monitor whose output passes its limits
        is dropped by push(), as any client."""
        cdef Connection m
        if "admin" in cmd.flags:
            return
        if cmd.subcommands and len(args) > 1:
            sub = cmd.subcommands.get(args[1].lower())
            if sub is not None and "admin" in (<Command>sub).flags:
                return
        line = monitor_line(self.addr, redacted(args))
        for m in list(self.core.monitors.values()):
            m.push(line)

    def start_monitor(self):
        """MONITOR: from now on this client gets every command's line."""
        if not self.monitoring:
            self.monitoring = True
            self.core.monitors[self.id] = self
            self.core.observers += 1

    def stop_monitor(self):
        if self.monitoring:
            self.monitoring = False
            del self.core.monitors[self.id]
            self.core.observers -= 1

    def watch(self, keys):
        """WATCH: EXEC aborts if a write names one of keys before it."""
        cdef ServerCore core = self.core
        if self.watching is None:
            self.watching = {}
        for key in keys:
            if key in self.watching:
                continue
            self.watching[key] = None
            watchers = core.watched_keys.get(key)
            if watchers is None:
                watchers = core.watched_keys[key] = {}
                core.observers += 1
            watchers[self.id] = self

    def unwatch(self):
        """Forgets every watched key (UNWATCH, EXEC, DISCARD, RESET)."""
        cdef ServerCore core = self.core
        self.watch_dirty = False
        if self.watching is None:
            return
        for key in self.watching:
            watchers = core.watched_keys[key]
            del watchers[self.id]
            if not watchers:
                del core.watched_keys[key]
                core.observers -= 1
        self.watching = None

    @property
    def watched_count(self):
        return len(self.watching) if self.watching is not None else 0

    cdef int dispatch(self, Command cmd, list args) except -1:
        # An int, not a void: its caller tests the -1, not PyErr_Occurred(),
        # on the path of every check.
        if cmd.fast == FAST_CL_CHECK:
            self.cl_check()
        elif cmd.fast == FAST_CL_LIMIT:
            self.cl_limit()
        elif cmd.fast == FAST_PING:
            self.ping()
        elif cmd.fast == FAST_MULTI:
            self.multi()
        elif cmd.fast == FAST_EXEC:
            self.exec_queued()
        elif cmd.fast == FAST_DISCARD:
            self.discard()
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

    # ---- commands that run entirely here ---------------------------------------

    cdef void cl_check(self):
        """CL.CHECK <key> <capacity> <refill_per_sec> [COST n] [PERIOD ms]"""
        cdef Arg* a = self.parser.argv
        cdef BucketParams bp
        cdef CheckResult r
        cdef int rc, bad = 0
        rc = read_check_args(a, self.parser.argc, &bp, &bad)
        if rc != OPT_OK:
            self.reply_error(options_error(rc, &a[bad], "COST or PERIOD"))
            return
        error = check_bucket(self.core, a[1].ptr, a[1].len, &bp, self.now_ms, &r)
        if error is not None:
            self.reply_error(error)
            return
        self.write_check(&r)

    cdef void write_check(self, const CheckResult* r, int extra=0):
        """[allowed, limit, remaining, retry_after_ms, reset_after_ms], with
        room for `extra` more elements the caller writes after them."""
        write_prefixed_int(&OUT, c'*', 5 + extra)
        write_prefixed_int(&OUT, c':', r.allowed)
        write_prefixed_int(&OUT, c':', r.limit)
        write_prefixed_int(&OUT, c':', r.remaining)
        write_prefixed_int(&OUT, c':', r.retry_after_ms)
        write_prefixed_int(&OUT, c':', r.reset_after_ms)

    cdef void cl_limit(self):
        """CL.LIMIT <client_key> <resource> [TIER t] [COST n] [DETAIL]"""
        cdef Arg* a = self.parser.argv
        cdef int n = 0, rc, bad = 0
        cdef LimitArgs la
        cdef CheckResult r
        cdef RuleEngine rules = self.core.rules
        rc = read_limit_args(a, self.parser.argc, &la, &bad)
        if rc != OPT_OK:
            self.reply_error(options_error(rc, &a[bad], "TIER, COST or DETAIL"))
            return
        error = check_limit(self.core, a[1].ptr, a[1].len, a[2].ptr, a[2].len, la.tier, la.tlen,
                            la.cost, self.now_ms, &r, &n)
        if error is not None:
            self.reply_error(error)
            return
        if not la.detail:
            self.write_check(&r)
            return
        self.write_check(&r, 1)
        encode_reply(&OUT, self.core.app.rules_detail(rules.last_detail(n)), self.proto)

    cdef void ping(self):
        if self.parser.argc > 2:
            self.reply_error("ERR wrong number of arguments for 'ping' command")
            return
        if self.subscribed and self.proto == 2:
            # a subscribed RESP2 client tells replies from pushes by shape
            write_raw(&OUT, b"*2\r\n$4\r\npong\r\n", 14)
            if self.parser.argc == 1:
                write_raw(&OUT, b"$0\r\n\r\n", 6)
                return
        if self.parser.argc == 1:
            write_raw(&OUT, b"+PONG\r\n", 7)
        else:
            write_bulk(&OUT, self.parser.argv[1].ptr, self.parser.argv[1].len)

    cdef void multi(self):
        if self.multi_queue is not None:
            self.reply_error("ERR MULTI calls can not be nested")
            return
        self.multi_queue = []
        self.multi_dirty = False
        write_raw(&OUT, b"+OK\r\n", 5)

    cdef void queue(self, Command cmd):
        if cmd.not_queued:
            self.run(cmd, None)
            return
        self.multi_queue.append((cmd, self.args_as_bytes()))
        write_raw(&OUT, b"+QUEUED\r\n", 9)

    cdef void discard(self):
        if self.multi_queue is None:
            self.reply_error("ERR DISCARD without MULTI")
            return
        self.multi_queue = None
        self.multi_dirty = False
        self.unwatch()
        write_raw(&OUT, b"+OK\r\n", 5)

    cdef void exec_queued(self):
        """Runs the queued commands back to back: the server is
        single-threaded, so nothing interleaves with them."""
        cdef list queued = self.multi_queue
        cdef Command cmd
        cdef list args
        cdef bytes arg
        cdef int i
        cdef int64_t started
        if queued is None:
            self.reply_error("ERR EXEC without MULTI")
            return
        self.multi_queue = None
        dirty = self.watch_dirty
        self.unwatch()    # as Redis, before the commands run: they touch no watch of its own
        if self.multi_dirty:
            self.multi_dirty = False
            self.reply_error("EXECABORT Transaction discarded because of previous errors.")
            return
        if dirty:
            # a watched key changed: the null array (RESP3's null)
            if self.proto == 3:
                write_raw(&OUT, b"_\r\n", 3)
            else:
                write_raw(&OUT, b"*-1\r\n", 5)
            return
        if self.core.readonly and any(c.is_write and not c.replica_peeks for c, _ in queued):
            # queued before the server became a replica (as Redis answers)
            self.reply_error("ERR Transaction contains write commands but instance is now "
                             "a read-only replica. EXEC aborted.")
            return
        write_prefixed_int(&OUT, c'*', len(queued))
        for cmd, args in queued:
            if parser_reserve(&self.parser, len(args)) != 0:
                self.reply_error("OOM out of memory")
                continue
            for i, arg in enumerate(args):
                self.parser.argv[i].ptr = PyBytes_AS_STRING(arg)
                self.parser.argv[i].len = PyBytes_GET_SIZE(arg)
            self.parser.argc = len(args)
            if self.restricted and self.acl_denied(cmd, True):
                continue      # its rules changed since it was queued
            started = fl_mono_ns()
            self.run(cmd, args)
            record_call(cmd, fl_mono_ns() - started)   # each its own call; EXEC's holds them all

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


def command_keys(Command cmd, list args):
    """The key arguments of a command, by its table entry's key positions."""
    cdef int last = cmd.last_key if cmd.last_key >= 0 else len(args) + cmd.last_key
    cdef int step = cmd.key_step if cmd.key_step > 0 else 1
    return args[cmd.first_key:last + 1:step]


def redacted(list args):
    """args as MONITOR shows them: AUTH's and HELLO AUTH's credentials
    replaced by "(redacted)", where Redis's handlers redact them."""
    name = args[0].lower()
    if name == b"auth" and len(args) <= 3:
        return args[:1] + [b"(redacted)"] * (len(args) - 1)
    if name != b"hello" or len(args) < 2 or args[1] not in (b"2", b"3"):
        return args
    out = list(args)
    i = 2
    while i < len(out):
        option = out[i].lower()
        if option == b"auth" and len(out) - 1 - i >= 2:
            out[i + 1] = out[i + 2] = b"(redacted)"
            i += 3
        elif option == b"setname" and len(out) - 1 - i >= 1:
            i += 2
        else:
            break     # Redis stops at the syntax error
    return out


def monitor_line(str addr, list args):
    """"+<unix time with us> [0 <addr>] "arg" ...": Redis's MONITOR line, each
    argument quoted as its sdscatrepr quotes it."""
    now = time.time()
    sec = int(now)
    head = b"+%d.%06d [0 %s] " % (sec, int((now - sec) * 1e6), addr.encode())
    return head + b" ".join(quoted(a) for a in args) + b"\r\n"


_REPR = {0x5c: b"\\\\", 0x22: b'\\"', 0x0a: b"\\n", 0x0d: b"\\r", 0x09: b"\\t",
         0x07: b"\\a", 0x08: b"\\b"}


def quoted(bytes a):
    """Redis's sdscatrepr: printable bytes as they are, the rest escaped."""
    cdef unsigned char c
    out = bytearray(b'"')
    for c in a:
        if c in _REPR:
            out += _REPR[c]
        elif 0x20 <= c <= 0x7e:
            out.append(c)
        else:
            out += b"\\x%02x" % c
    out.append(0x22)
    return bytes(out)


# Redis's reasons (multi.c) when EXEC finds a queued command no longer allowed.
EXEC_DENIALS = {"command": "no permission to execute the command or subcommand",
                "key": "no permission to touch the specified keys",
                "channel": "no permission to access one of the channels used as arguments"}
# The upper bounds, in seconds, of Command.latency_buckets() but the last (+Inf).
LATENCY_BOUNDS = tuple(FL_LATENCY_BOUNDS_NS[i] / 1e9 for i in range(LATENCY_BUCKETS - 1))


# ---- decisions every front makes the same way (RESP here, HTTP in _http.pyx) ----

cdef str check_bucket(ServerCore core, const char* key, size_t keylen, const BucketParams* bp,
                      int64_t now_ms, CheckResult* r):
    """CL.CHECK's decision into r: None, or the error reply's text."""
    cdef const char* err = bucket_params_error(bp)
    cdef int rc
    if err != NULL:
        return "ERR " + err.decode()
    if core.readonly and bp.cost != 0:
        return READONLY_ERROR    # a replica answers peeks only
    rc = bucket_check(&core.store.table, key, keylen, bp, now_ms, not core.readonly, r)
    if rc != FL_OK:    # one test on the way of an answer
        if rc == FL_EKEYLEN:
            return "ERR key is longer than 65535 bytes"
        if rc == FL_EOOM:
            return OOM_ERROR
        return "OOM out of memory: the bucket could not be stored"
    return None


cdef str check_limit(ServerCore core, const char* client, size_t clen, const char* resource,
                     size_t rlen, const char* tier, size_t tlen, int64_t cost, int64_t now_ms,
                     CheckResult* r, int* nrules):
    """CL.LIMIT's decision over the matching rules (*nrules of them, for
    DETAIL) into r: None, or the error reply's text."""
    cdef RuleEngine rules = core.rules
    cdef int rc
    if core.readonly and cost != 0:
        return READONLY_ERROR
    try:
        nrules[0] = rules.select_rules(client, clen, resource, rlen, tier, tlen)
        rc = rules.evaluate(client, clen, resource, rlen, nrules[0], cost, now_ms, r)
    except ValueError as e:
        return f"ERR {e}"
    if rc != FL_OK:    # one test on the way of an answer
        if rc == FL_EKEYLEN:
            return "ERR client key and resource are longer than 65535 bytes"
        if rc == FL_EOOM:
            return OOM_ERROR
        return "OOM out of memory: the bucket could not be stored"
    return None
LOG_VERBOSE = 15     # the "verbose" loglevel (server/config.py LOGLEVELS)


cdef inline bint glob_token(const char* p, size_t n, size_t i, char ch,
                            size_t* end) noexcept:
    """Whether the one-byte token at p[i] ('?', a class, an escaped or a
    plain byte) admits ch; *end is where the token ends.  Classes read as
    stringmatchlen reads them: "^" negates, "\\" escapes, "x-y" is a range
    (reversed ones swapped, bytes compared as C's signed char, and its end
    may be "]"), and one the pattern ends inside takes the rest."""
    cdef size_t j
    cdef bint negate, found = False
    cdef signed char lo, hi, t
    if p[i] == c'?':
        end[0] = i + 1
        return True
    if p[i] == c'[':
        j = i + 1
        negate = j < n and p[j] == c'^'
        if negate:
            j += 1
        while True:
            if j < n and p[j] == c'\\' and n - j >= 2:
                j += 1
                found = found or p[j] == ch
            elif j < n and p[j] == c']':
                break
            elif j >= n:
                j -= 1          # the class ran to the end of the pattern
                break
            elif n - j >= 3 and p[j + 1] == c'-':
                lo, hi = <signed char>p[j], <signed char>p[j + 2]
                if lo > hi:
                    t = lo
                    lo = hi
                    hi = t
                j += 2
                found = found or lo <= <signed char>ch <= hi
            else:
                found = found or p[j] == ch
            j += 1
        end[0] = j + 1
        return found != negate
    if p[i] == c'\\' and n - i >= 2:
        i += 1
    end[0] = i + 1
    return p[i] == ch


cdef bint glob_match(const char* p, size_t n, const char* s, size_t m) noexcept:
    """Redis's stringmatchlen, case-sensitive, without its recursion.
    Every token but "*" takes exactly one byte, so on a mismatch only the
    last "*" needs to take one byte more (an earlier one taking more
    could only move the rest later, where it was already tried): the
    time is at most O(n * m), with no stack.  Like stringmatchlen, an
    empty string matches only the empty pattern ("*" included)."""
    cdef size_t pi = 0, si = 0, end = 0, star_p = 0, star_s = 0
    cdef bint starred = False
    if m == 0:
        return n == 0
    while si < m:
        if pi < n and p[pi] == c'*':
            while pi < n and p[pi] == c'*':
                pi += 1
            if pi == n:
                return True
            starred, star_p, star_s = True, pi, si
            continue
        if pi < n and glob_token(p, n, pi, s[si], &end):
            pi = end
            si += 1
            continue
        if not starred:
            return False
        star_s += 1
        si, pi = star_s, star_p
    while pi < n and p[pi] == c'*':
        pi += 1
    return pi == n


def glob(bytes pattern, bytes string):
    """Whether pattern matches string by Redis's stringmatchlen rules
    (case-sensitive), as PSUBSCRIBE and PUBSUB CHANNELS match."""
    return glob_match(PyBytes_AS_STRING(pattern), PyBytes_GET_SIZE(pattern),
                      PyBytes_AS_STRING(string), PyBytes_GET_SIZE(string))


cdef str unknown_command_message(const Arg* argv, int argc):
    # Redis: ERR unknown command 'x', with args beginning with: 'a' 'b'
    # (the quoted list stops once it reaches 128 characters)
    cdef int i = 1
    cdef str args = ""
    while i < argc and len(args) < 128:
        args += f"'{arg_text(&argv[i], 128 - len(args))}' "
        i += 1
    return f"ERR unknown command '{arg_text(&argv[0])}', with args beginning with: {args}"


cdef extern from "Python.h":
    # Borrowed, unchecked: the ACL check reads its own tuples of bytes.
    PyObject* tuple_item "PyTuple_GET_ITEM"(PyObject* t, Py_ssize_t i)
    Py_ssize_t tuple_size "PyTuple_GET_SIZE"(PyObject* t)
    char* bytes_data "PyBytes_AS_STRING"(PyObject* b)
    Py_ssize_t bytes_size "PyBytes_GET_SIZE"(PyObject* b)


cdef inline bint key_admitted(tuple keys, const Arg* key) noexcept:
    """Whether keys (server/acl.py's (prefixes, globs): a pattern that is a
    literal then one "*" is a prefix, compared with memcmp; the others
    are globs) admit key."""
    cdef PyObject* group
    cdef PyObject* p
    cdef Py_ssize_t j, n
    group = tuple_item(<PyObject*>keys, 0)
    for j in range(tuple_size(group)):
        p = tuple_item(group, j)
        n = bytes_size(p)
        # (an empty key matches no pattern, as in stringmatchlen)
        if key.len > 0 and <Py_ssize_t>key.len >= n and memcmp(bytes_data(p), key.ptr, n) == 0:
            return True
    group = tuple_item(<PyObject*>keys, 1)
    for j in range(tuple_size(group)):
        p = tuple_item(group, j)
        if glob_match(bytes_data(p), bytes_size(p), key.ptr, key.len):
            return True
    return False


cdef int acl_verdict(bytes perm, tuple keys, Command cmd, const Arg* argv, int argc) except -2:
    """Whether an ACL grant (permission map, and key patterns as
    key_admitted reads them or None for all keys; see server/acl.py)
    admits cmd (the subcommand, for a container) with argv: 0 when it
    does, -1 when the command is not allowed, else the position of the
    first key (first_key..last_key by key_step, as COMMAND shows them)
    no pattern admits.  Every front asks this."""
    cdef int i, last
    if cmd.acl_id >= PyBytes_GET_SIZE(perm) or not (<const unsigned char*>PyBytes_AS_STRING(
            perm))[cmd.acl_id]:
        return -1
    if keys is None or cmd.first_key <= 0:
        return 0
    last = cmd.last_key if cmd.last_key >= 0 else argc + cmd.last_key
    if last > argc - 1:
        last = argc - 1
    i = cmd.first_key
    while i <= last:
        if not key_admitted(keys, &argv[i]):
            return i
        i += cmd.key_step if cmd.key_step > 0 else 1
    return 0


def acl_check(grant, Command cmd, list args):
    """acl_verdict for Python callers (ACL DRYRUN, the HTTP front): args
    are the command's bytes, args[0] its name.  None: unrestricted."""
    cdef int i, argc = len(args)
    cdef Arg* argv
    cdef bytes a
    if grant is None:
        return 0
    argv = <Arg*>malloc(sizeof(Arg) * (argc if argc > 0 else 1))
    if argv == NULL:
        raise MemoryError()
    try:
        for i in range(argc):
            a = args[i]
            argv[i].ptr = PyBytes_AS_STRING(a)
            argv[i].len = PyBytes_GET_SIZE(a)
        return acl_verdict(grant[0], grant[1], cmd, argv, argc)   # (channels: acl.py's)
    finally:
        free(argv)


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
