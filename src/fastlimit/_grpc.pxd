# The gRPC front's connection: cleartext HTTP/2 (h2c with prior knowledge,
# as Envoy's gRPC client speaks it) driven by libnghttp2, the gRPC framing,
# and the two Envoy RLS messages (RateLimitRequest in, RateLimitResponse
# out) and grpc.health.v1's read and written by hand in C.  nghttp2 calls
# back into C functions only (no Python per frame); a call whose request is
# complete is answered after nghttp2 has read the whole chunk, and all the
# frames of one read go out in one write.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from fastlimit._protocol cimport Command, ServerCore
from fastlimit._resp cimport Writer
from fastlimit._rls cimport Decider
# Every name of the C library's starts nghttp2_ or NGHTTP2_, as in C.
from fastlimit.nghttp2 cimport *


cdef enum:
    # A request message past this (gRPC framing included) gets
    # RESOURCE_EXHAUSTED, as grpc's max receive message size does; an RLS
    # request is a few hundred bytes.
    MAX_MESSAGE_BYTES = 1024 * 1024
    # Request bytes all the unfinished calls of one connection may hold.
    MAX_CONNECTION_BUFFERED = 4 * 1024 * 1024
    # One request's header list, as HTTP/2 counts it (name + value + 32
    # per field): past it the stream is reset (an HPACK bomb stops here).
    MAX_HEADER_LIST_BYTES = 16 * 1024
    # Entries of one RateLimitDescriptor: Envoy sends one per action of a
    # rate limit, a handful; past it the call is RESOURCE_EXHAUSTED (each
    # entry costs the decision Python work).
    MAX_DESCRIPTOR_ENTRIES = 32
    # The descriptors one connection's calls are answered per event-loop
    # turn (a call without any counts one; at least one call a turn): about
    # a millisecond of the decision's work, then the other clients get
    # theirs and the rest waits for the next turn, as RESP's 16 KB.
    TURN_DESCRIPTORS = 256


cdef enum Route:
    ROUTE_UNKNOWN = 0
    ROUTE_RLS = 1        # /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
    ROUTE_HEALTH = 2     # /grpc.health.v1.Health/Check


# The bounds every connection reads (set from the settings).
cdef struct Limits:
    uint32_t max_streams
    uint32_t max_descriptors  # per ShouldRateLimit (grpc-max-descriptors)
    int64_t deadline_ns       # the server's answer budget per call; 0: none
    # How long each phase of a connection may wait on its client
    # (http-header-timeout; 0: forever): its preface, the end of a request,
    # taking the answers waiting for it (its HTTP/2 window or its socket).
    int64_t client_wait_ns


# What the connections of a front have in C, summed for INFO memory.
cdef struct Totals:
    size_t memory             # every byte the connections hold in C


cdef struct Buf:
    uint8_t* data
    size_t len
    size_t cap


cdef struct Stream:
    int32_t id
    Route route
    uint8_t queued            # in the connection's ready list
    uint8_t answered          # a response is submitted
    uint8_t cut_off           # answered before its request ended: reset once sent
    uint8_t post              # :method POST
    uint8_t grpc_type         # content-type application/grpc[+...|;...]
    uint8_t compressed_ok     # grpc-encoding names a codec (a compressed message
                              # is then UNIMPLEMENTED, not malformed)
    Buf authorization         # its authorization header: the users decide when the
                              # call runs (GrpcConnection.caller)
    int status                # a gRPC status decided before the call ran; 0: none
    const char* message       # its grpc-message
    size_t header_bytes
    int64_t started_ns        # when its HEADERS began
    int64_t deadline_ns       # when the call must have been answered; 0: never
    int deadline_status       # what it gets then: DEADLINE_EXCEEDED or UNAVAILABLE
    int64_t client_deadline_ns  # grpc-timeout's end; 0: none
    int64_t request_deadline_ns # when its request must have ended (client_wait_ns)
    Buf body                  # the request's DATA, freed once the call is answered
    Buf reply                 # the response's DATA (one gRPC message), freed once sent
    size_t reply_sent
    Stream* prev              # the connection's open streams, oldest first
    Stream* next


cdef struct Conn:
    nghttp2_session* session
    const Limits* limits
    Totals* totals
    size_t memory             # what this connection holds in C
    size_t buffered           # request bytes of its unfinished calls
    Stream* first
    Stream* last
    uint32_t unanswered
    size_t unsent             # reply bytes answered, waiting on the client's window
    uint8_t reply_moved       # reply bytes went out since the connection last looked
    int32_t* ready            # streams whose request is complete, in order
    uint32_t nready
    uint32_t ready_cap
    uint8_t out_of_memory
    uint8_t protocol_error    # it sent (or must send) a GOAWAY with an error
    uint8_t greeted           # the client's preface (magic and SETTINGS) came


cdef class GrpcShared:
    """What every gRPC connection shares: the engine, the bounds, the
    counters, the per-call statistics, and the front (server/grpc/)."""
    cdef readonly ServerCore core
    cdef readonly object front
    cdef public object app            # the server: app.rls.service decides
    cdef public Decider decider       # the rate limit service's (rls/service.py)
    cdef public object loop
    cdef Limits limits
    cdef Totals totals
    cdef public bint draining         # shutting down: health says NOT_SERVING
    cdef readonly set connections
    cdef readonly dict endpoint_stats  # name -> Command (calls, nsec, failed_calls)
    cdef Command rls_stats
    cdef Command health_stats
    cdef Command other_stats
    cdef public int64_t total_connections
    cdef public int64_t rejected_connections
    cdef public int64_t protocol_errors
    cdef public int64_t greeting_timeouts
    cdef public int64_t deferred_calls      # calls left for a later turn (each time)
    cdef public int64_t stall_timeouts      # closed: answers not taken in client_wait_ns
    cdef public int64_t output_limit_disconnections   # closed: client-output-buffer-limit
    cdef public int64_t request_timeouts    # calls whose request did not end in client_wait_ns


cdef class GrpcConnection:
    cdef GrpcShared shared
    cdef Conn c
    cdef object transport
    cdef object timer                 # wakes expire() at the earliest deadline
    cdef object greeting_timer        # closes a client that never sends its preface
    cdef object stall_timer           # closes a client that stops taking its answers
    cdef int64_t stalled_since        # answers wait on the client since; 0: none wait
    cdef int64_t soft_limit_since     # unsent output over the soft limit since; 0: not
    cdef int64_t timer_at
    cdef Writer out
    cdef bint closed
    cdef bint paused                  # the client does not read: we stop reading
    cdef bint deferred                # calls wait for next_turn: we stop reading
    # The last authorization header, the user it names (None: none) and the
    # users' version then: Envoy sends the same one on every call, and any
    # change of the users (ACL SETUSER, ACL LOAD, CONFIG SET requirepass)
    # moves the version on, so the next call asks the users again.
    cdef bytes known_authorization
    cdef object known_user
    cdef int64_t known_version

    cdef void release(self) noexcept
    cdef void process_ready(self)
    cdef void defer(self)
    cdef void read_again(self)
    cdef int answer(self, Stream* s, int64_t now) except -1
    cdef object caller(self, Stream* s)
    cdef object user_of(self, Stream* s)
    cdef bint may_check(self, Stream* s, object user, bytes domain) except -1
    cdef int rate_limit(self, Stream* s, const uint8_t* msg, size_t n, object user) except -1
    cdef void send_decision(self, Stream* s, int overall, list statuses, list headers) except *
    cdef bint answerable(self, Stream* s) except -1
    cdef int start_message(self) except -1
    cdef int send_message(self, Stream* s) except -1
    cdef int health(self, Stream* s, const uint8_t* msg, size_t n) except -1
    cdef void reply(self, Stream* s)
    cdef void fail(self, Stream* s, int status, const char* message, int http_status=*)
    cdef void fail_text(self, Stream* s, int status, str message)
    cdef void fail_with(self, Stream* s, int status, const char* message, size_t length,
                        int http_status)
    cdef void arm_timer(self, int64_t now)
    cdef void flush(self)
    cdef bint send_queued(self)
    cdef void watch_output(self)
    cdef bint over_output_limits(self, int64_t pending)
    cdef void drop(self, const char* why)
    cdef void close_transport(self)
