# One client connection's protocol state machine: buffer what arrives,
# parse every complete command, dispatch through the command table, and
# send all replies of a read with one write.  It knows the transport
# only as an object with write/close/abort/get_write_buffer_size, so it
# runs under asyncio, uvloop or a test double alike.

from libc.stdint cimport int64_t, uint16_t

from fastlimit._core cimport BucketStore, Clock
from fastlimit._rules cimport RuleEngine
from fastlimit._resp cimport Parser, ParseLimits, Arg
from fastlimit._core cimport CheckResult, BucketParams
from fastlimit._cluster cimport CLUSTER_SLOTS
from fastlimit._hotkeys cimport HotKeys, fl_hk
from fastlimit._load cimport LoadMeter, fl_load


cdef enum FastPath:
    # Commands whose whole execution lives in C; the rest call a Python
    # handler.  From FAST_MULTI on are the commands that control the
    # dispatcher itself, which run at once even inside MULTI.
    FAST_NONE = 0
    FAST_CL_CHECK = 1
    FAST_CL_LIMIT = 2
    FAST_PING = 3
    FAST_MULTI = 4
    FAST_EXEC = 5
    FAST_DISCARD = 6
    FAST_QUIT = 7
    FAST_RESET = 8


# The latency histogram of every Command: Prometheus's classic buckets,
# in ns (5us .. 1s), and a last one past them (le="+Inf"), whose bound is
# a sentinel no time reaches.
cdef extern from *:
    """
    static const int64_t FL_LATENCY_BOUNDS_NS[] = {
        5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
        5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 1000000000,
        INT64_MAX};
    """
    const int64_t FL_LATENCY_BOUNDS_NS[]

cdef enum:
    LATENCY_BUCKETS = 17              # the 16 bounds above and +Inf (the sentinel)


cdef class Command:
    """One entry of the command table: everything dispatch, arity checks,
    COMMAND replies and per-command statistics need."""
    cdef readonly str name            # lowercase; "parent|sub" for subcommands
    cdef readonly int arity           # N exact, -N at least N (as Redis)
    cdef readonly tuple flags         # Redis flag names, e.g. ("fast", "write")
    cdef readonly int first_key
    cdef readonly int last_key
    cdef readonly int key_step
    cdef readonly int fast
    cdef readonly object handler      # handler(conn, args) -> reply, or None
    cdef readonly dict subcommands    # lowercase bytes -> Command
    cdef readonly dict doc            # summary, since, group, complexity, arguments
    cdef readonly tuple acl_categories
    cdef readonly bint no_auth
    cdef readonly bint no_multi
    cdef readonly bint is_write
    cdef readonly bint replica_peeks  # a write that spends nothing with COST 0: a replica runs it
    cdef readonly bint when_subscribed  # allowed on a subscribed RESP2 connection (PING, SUBSCRIBE...)
    cdef readonly bint not_queued     # runs at once inside MULTI, as Redis runs WATCH (to refuse it)
    cdef public int acl_id            # its byte in an ACL user's permission map (acl/users.py)
    cdef public bint has_channels     # names Pub/Sub channels ACL rules restrict (PUBLISH...)
    cdef public int64_t calls
    cdef public int64_t nsec
    cdef public int64_t failed_calls
    cdef public int64_t rejected_calls
    cdef int64_t latency[LATENCY_BUCKETS]   # calls per bucket (not cumulative)

    cdef bint arity_ok(self, int argc) noexcept


# One finished call of cmd that took ns: its count, its time and its
# latency bucket.  The one place calls are counted, by every front (RESP
# here, HTTP in _http), so commands_total and the histogram always agree.
# Linear from the smallest bucket: a check falls in the first one.
cdef inline void record_call(Command cmd, int64_t ns) noexcept:
    cdef int i = 0
    while ns > FL_LATENCY_BOUNDS_NS[i]:
        i += 1
    cmd.calls += 1
    cmd.nsec += ns
    cmd.latency[i] += 1


cdef class ServerCore:
    """State every connection shares: the engine, the clock, the command
    table, limits and counters.  Owned by the event-loop layer."""
    cdef public BucketStore store
    cdef public RuleEngine rules     # buckets of named rules
    cdef public Clock clock
    cdef public dict commands         # lowercase bytes -> Command
    cdef public object requirepass    # bytes or None
    # ACL (acl/users.py keeps them): the user new connections start as;
    # whether they start unauthenticated; protected mode's refusal text
    # for non-local peers, None while it does not apply.
    cdef public object default_user
    cdef public bint auth_required
    cdef public object protected_refusal
    cdef ParseLimits limits
    cdef public int64_t query_buffer_limit
    cdef public int64_t output_hard_limit
    cdef public int64_t output_soft_limit
    cdef public double output_soft_seconds
    cdef public int64_t pubsub_hard_limit     # the pubsub class, for subscribed clients
    cdef public int64_t pubsub_soft_limit
    cdef public double pubsub_soft_seconds
    cdef public int64_t maxclients
    # maxclients is one budget for every front: the connection collections
    # it counts (these clients, the HTTP and gRPC fronts' connections), and
    # TLS connections accepted whose handshake has not ended (server/admission.py).
    cdef public list budget
    cdef public int64_t handshaking
    cdef double full_logged_at        # when "maxclients reached" was last logged
    cpdef bint full(self) except -1
    cpdef bint refuses(self, object transport) except -1
    cdef public dict clients          # client id -> Connection
    cdef public int64_t next_client_id
    cdef public int64_t total_commands
    cdef public int64_t total_connections
    cdef public int64_t rejected_connections
    cdef public int64_t total_error_replies
    cdef public int64_t protocol_errors  # connections closed for a protocol error
    cdef public dict error_counts     # error code ("ERR", "NOAUTH") -> replies
    cdef public int64_t net_input_bytes
    cdef public int64_t net_output_bytes
    cdef public bint readonly         # a replica: writes get -READONLY
    cdef public object app            # the event-loop layer's server object
    cdef public object log
    # Cluster mode (cluster/subsystem.py sets these through set_routing): a
    # keyed command for a slot this node does not serve as primary gets
    # -MOVED to the slot's shard's primary, moved_to[slot_shard[slot]].
    # A paused slot (SLOT_PAUSED, during the last step of a slot move) is
    # served, but a command on it waits, unanswered and unconsumed, with its
    # connection's input held, in slot_waiters until resume_slots().
    cdef readonly bint cluster_routing
    cdef unsigned char slot_served[CLUSTER_SLOTS]   # SLOT_NOT_SERVED, _SERVED, _PAUSED
    cdef dict slot_waiters            # connection id -> Connection
    cdef uint16_t slot_shard[CLUSTER_SLOTS]
    cdef list moved_to                # per shard: "ip:port", or None when no primary is known
    # MONITOR and WATCH (issue 16): who is told of each command run.  One C
    # int tells the dispatcher whether anyone is (Connection.run): while
    # nobody monitors or watches, a command costs one test of it.
    cdef readonly int observers       # len(monitors) + len(watched_keys)
    cdef readonly dict monitors       # client id -> Connection in MONITOR mode
    cdef readonly dict watched_keys   # key -> {client id: Connection} watching it
    # The hot-key tracker (hotkeys/, issue 26): every check of the fronts
    # passes through check_bucket or RuleEngine.evaluate, which decrement hot's
    # countdown and offer the key to it one check in its sample.
    cdef readonly HotKeys hotkeys
    cdef fl_hk* hot
    # Overload (overload/, issue 26): the saturation meter, whose level the
    # check path reads (fl_load_sheds: one compare a check), and the RESP
    # connections held back while saturated, which drain_held() serves a
    # turn's budget at a time after every critical connection's read.
    cdef readonly LoadMeter load_meter
    cdef fl_load* load
    cdef object held                  # collections.deque of Connection
    cdef bint drain_scheduled
    # A takeover's flip (takeover/): while paused no client command runs;
    # each connection keeps its input, held, in pause_waiters until
    # resume_clients().  A replica link is not paused: it carries the flip.
    cdef readonly bint paused
    cdef dict pause_waiters           # connection id -> Connection

    cdef str route_key(self, const char* key, size_t n)


cdef class Connection:
    cdef readonly ServerCore core
    cdef readonly object transport    # asyncio.Transport; None once lost
    cdef Parser parser
    cdef char* inbuf
    cdef size_t inlen
    cdef size_t incap
    cdef int64_t now_ms
    cdef double soft_limit_since
    cdef Command last_cmd
    cdef char last_name[32]
    cdef size_t last_name_len
    cdef bint multi_dirty
    cdef bint closed
    cdef bint busy             # inside process(): replies not sent yet
    cdef size_t read_this_turn # bytes taken since the loop last gave others a turn
    cdef bint input_held       # reading paused: for others' turn, or a sliced reply
    cdef bint more_input       # whole commands wait in inbuf for this connection's next turn
    cdef bint in_exec          # EXEC is running its queued commands, none of which may wait
    # Overload: the priority its checks ask for (or its user's), which
    # orders its reads while the node is saturated; its user's priority
    # (FL_PRIO_UNSET: none), which is also the highest its checks may ask;
    # and, while held back, since when and how many bytes.
    cdef readonly int priority
    cdef int user_priority
    cdef bint held_back
    cdef int64_t held_since
    cdef int64_t held_bytes
    cdef object sliced         # a Sliced reply being made (its later commands wait)
    cdef bint waits_for_slot   # sliced is SLOT_WAIT: waiting_command waits for its slot
    cdef bytes waiting_command
    cdef Command sliced_cmd
    cdef int64_t sliced_ns     # the time its slices took so far (one call, recorded at the end)
    cdef readonly int64_t id
    cdef public int proto
    cdef public bint authenticated
    cdef public bint close_after_reply
    cdef public object name
    cdef public object lib_name
    cdef public object lib_ver
    cdef readonly str addr
    cdef readonly str laddr
    cdef readonly double created
    cdef readonly double last_interaction
    cdef public list multi_queue      # None outside MULTI
    cdef public str last_subcommand   # 'client|list' after CLIENT LIST
    cdef public object replica        # set when a replica syncs over this connection
    cdef public int replica_port      # REPLCONF listening-port
    # Pub/Sub (pubsub/subsystem.py keeps them): channel or pattern -> None, in
    # the order subscribed; None until the first subscription.
    cdef public dict pubsub_channels
    cdef public dict pubsub_patterns
    cdef public bint subscribed       # Redis's CLIENT_PUBSUB: a subscription is open
    cdef public int64_t pubsub_bytes  # what its subscriptions hold (estimated)
    cdef size_t batch_len      # while busy: the bytes of the read being run (Redis's querybuf)
    cdef bint sliced_silent           # the sliced reply being made is silenced (CLIENT REPLY)
    cdef public int reply_mode        # CLIENT REPLY: REPLY_ON, _OFF, _SKIP, _SKIP_NEXT
    cdef list silent_pushes           # pushes made while its replies are silenced
    cdef readonly bint monitoring     # in MONITOR mode
    cdef readonly dict watching       # WATCHed keys -> None; None when there are none
    cdef readonly bint watch_dirty    # a watched key changed: EXEC aborts
    # ACL: the user (acl/users.py's User) and, when it may not run every
    # command on every key, its permission map (one byte per Command.acl_id)
    # and key patterns (None: all keys).  The default user is unrestricted,
    # so its commands pay one bint test.
    cdef readonly object user
    cdef bint restricted
    cdef bytes acl_perm
    cdef tuple acl_keys
    cdef object acl_channels          # channel patterns, None for all channels

    cdef void receive(self, bytes data)
    cdef bint append_input(self, bytes data)
    cdef void hold_back(self)
    cdef void queue_turn(self)
    cdef void hold_input(self)
    cdef void wait_for_resume(self)
    cdef void process(self, const char* buf, size_t n)
    cdef void run_commands(self, const char* buf, size_t n)
    cdef void protocol_error(self)
    cdef void keep_tail(self, const char* buf, size_t n)
    cdef int check_query_buffer(self, size_t n) except -1
    cdef void execute(self)
    cdef void execute_silenced(self)
    cdef int dispatch(self, Command cmd, list args) except -1
    cdef void on_replica_link(self, Command cmd)
    cdef void reject(self, Command cmd, str msg)
    cdef void refuse_when_subscribed(self, Command cmd)
    cdef void run(self, Command cmd, list args)
    cdef Command lookup(self, const Arg* a)
    cdef void run_python(self, Command cmd, list args)
    cdef bint may_slice(self)
    cdef void reply_error(self, str msg)
    cdef void flush(self)
    cdef void check_output_limits(self)
    cdef void over_output_limits(self, int64_t pending, int64_t hard, int64_t soft,
                                 double soft_seconds)
    cdef list args_as_bytes(self)


# ---- the concerns of a connection, a file each that _protocol.pyx includes --------
# Functions of the connection (or of the state all connections share) that
# execute() and dispatch() call directly, as Redis's processCommand calls
# acl.c, cluster.c and multi.c.  A file's inline helpers are not declared here.

# _protocol_checks.pxi: the commands that run entirely in C, and the
# decisions every front makes the same way (None, or the error reply's
# text: "ERR ...", "OOM ...").
cdef void cl_check(Connection c)
cdef void cl_limit(Connection c)
cdef void write_check(Connection c, const CheckResult* r, int extra=*)
cdef void ping(Connection c)
cdef bint queued_write(Connection c, Command cmd)
# The priority arguments: what the request asked (FL_PRIO_UNSET: nothing),
# already capped at its user's; the fallback when neither it nor a rule
# says (its user's, or normal).  A shed check's r has remaining
# FL_SHED_REMAINING, allowed by the failure policy.
cdef str check_bucket(ServerCore core, const char* key, size_t keylen, const BucketParams* bp,
                      int split, int priority, int64_t now_ms, CheckResult* r)
cdef str check_limit(ServerCore core, const char* client, size_t clen, const char* resource,
                     size_t rlen, const char* tier, size_t tlen, int64_t cost, int asked,
                     int fallback, int64_t now_ms, CheckResult* r, int* nrules)
cdef void shed_result(fl_load* load, int priority, int64_t limit, bint fail_closed,
                      CheckResult* r) noexcept

# _protocol_multi.pxi: MULTI, EXEC, DISCARD and WATCH.
cdef void begin_multi(Connection c)
cdef void queue_in_multi(Connection c, Command cmd)
cdef void discard_multi(Connection c)
cdef void exec_queued(Connection c)
cdef int watch_keys(Connection c, keys) except -1
cdef int unwatch_all(Connection c) except -1
cdef int touch_watched_keys(ServerCore core, keys) except -1
cdef int touch_all_watched_keys(ServerCore core) except -1

# _protocol_acl.pxi: whether an ACL grant admits cmd with argv (0, -1 for
# the command, or the position of the key it does not), which every front
# asks; the RESP connection's refusal; the user a connection runs as.
cdef int acl_verdict(bytes perm, tuple keys, Command cmd, const Arg* argv, int argc) except -2
cdef bint acl_denied(Connection c, Command cmd, bint at_exec)
cdef int acl_set_user(Connection c, user, bint authenticated) except -1

# _protocol_slots.pxi: cluster routing.
cdef int set_slot_routing(ServerCore core, served, shard_of_slot, list moved_to) except -1
cdef int pause_served_slots(ServerCore core, mask) except -1
cdef int resume_paused_slots(ServerCore core) except -1
cdef bint slot_runs_here(ServerCore core, int slot) except -1
cdef void redirect(Connection c, Command cmd)
cdef void wait_for_slot(Connection c)
cdef bint requeue_waiting(Connection c)

# _protocol_observe.pxi: MONITOR, and WATCH told of the writes.
cdef void run_observed(Connection c, Command cmd, list args)
cdef void feed_monitors(Connection c, Command cmd, list args)
cdef int monitor_start(Connection c) except -1
cdef int monitor_stop(Connection c) except -1

# _protocol_glob.pxi: Redis's stringmatchlen (case-sensitive), whether
# pattern p[0:n] matches s[0:m], with no recursion (the bound is there).
cdef bint glob_match(const char* p, size_t n, const char* s, size_t m) noexcept
