"""The gRPC front's connection; see _grpc.pxd."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset, strlen

from fastlimit._core cimport fl_mono_ns
from fastlimit._protocol cimport Command, ServerCore, record_call
from fastlimit._protocol import acl_check, credentials, peer_text
from fastlimit._resp cimport Writer, writer_free, writer_init, writer_reserve, writer_reset, write_raw
from fastlimit._rls cimport (Decider, RlsDescriptor, RlsEntry, RlsOutcome, RlsRequest, RlsStatus,
                             Slice, fl_room, request_objects)
from fastlimit._rls import RlsError, RlsHome

import asyncio
import functools

# gRPC status codes (grpc/doc/statuscodes.md)
cdef enum:
    GRPC_OK = 0
    GRPC_UNKNOWN = 2
    GRPC_DEADLINE_EXCEEDED = 4
    GRPC_NOT_FOUND = 5
    GRPC_PERMISSION_DENIED = 7
    GRPC_RESOURCE_EXHAUSTED = 8
    GRPC_UNIMPLEMENTED = 12
    GRPC_INTERNAL = 13
    GRPC_UNAVAILABLE = 14
    GRPC_UNAUTHENTICATED = 16

# grpc.health.v1.HealthCheckResponse.ServingStatus
cdef enum:
    HEALTH_SERVING = 1
    HEALTH_NOT_SERVING = 2

RLS_PATH = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH_PATH = b"/grpc.health.v1.Health/Check"
# The names the health service knows: the server as a whole, and the RLS.
RLS_SERVICE = b"envoy.service.ratelimit.v3.RateLimitService"
ENDPOINT_NAMES = ("should_rate_limit", "health_check", "unimplemented")

# The same, for the C callbacks
cdef const char* RLS_PATH_C = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
cdef const char* HEALTH_PATH_C = "/grpc.health.v1.Health/Check"
cdef const char* RLS_SERVICE_C = "envoy.service.ratelimit.v3.RateLimitService"
cdef size_t RLS_PATH_N = strlen(RLS_PATH_C)
cdef size_t HEALTH_PATH_N = strlen(HEALTH_PATH_C)
cdef size_t RLS_SERVICE_N = strlen(RLS_SERVICE_C)

# One response message is made here, then copied to its stream: the server
# is single-threaded and makes each to completion before the next.
cdef Writer MSG
if writer_init(&MSG, 4096) != 0:
    raise MemoryError()


# ---- what a connection holds in C, counted ---------------------------------------------
#
# Every allocation of a connection (nghttp2's session, HPACK tables and
# queues as well as the streams and their buffers) goes through these, so
# INFO shows exactly what the gRPC connections hold.  Each block carries its
# size in front of it (16 bytes keep malloc's alignment).

cdef enum:
    BLOCK_HEAD = 16


cdef void* conn_malloc(size_t size, void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef size_t* p
    if size > (<size_t>-1) - BLOCK_HEAD:
        return NULL
    p = <size_t*>malloc(size + BLOCK_HEAD)
    if p == NULL:
        c.out_of_memory = 1
        return NULL
    p[0] = size
    c.memory += size
    c.totals.memory += size
    return <char*>p + BLOCK_HEAD


cdef void conn_free(void* ptr, void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef size_t* p
    if ptr == NULL:
        return
    p = <size_t*>(<char*>ptr - BLOCK_HEAD)
    c.memory -= p[0]
    c.totals.memory -= p[0]
    free(p)


cdef void* conn_calloc(size_t nmemb, size_t size, void* ud) noexcept nogil:
    cdef void* p
    if size and nmemb > (<size_t>-1) // size:
        return NULL
    p = conn_malloc(nmemb * size, ud)
    if p != NULL:
        memset(p, 0, nmemb * size)
    return p


cdef void* conn_realloc(void* ptr, size_t size, void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef size_t* p
    cdef size_t old
    if ptr == NULL:
        return conn_malloc(size, ud)
    if size == 0:
        conn_free(ptr, ud)
        return NULL
    if size > (<size_t>-1) - BLOCK_HEAD:
        return NULL
    p = <size_t*>(<char*>ptr - BLOCK_HEAD)
    old = p[0]
    p = <size_t*>realloc(p, size + BLOCK_HEAD)
    if p == NULL:
        c.out_of_memory = 1
        return NULL
    p[0] = size
    c.memory = c.memory - old + size
    c.totals.memory = c.totals.memory - old + size
    return <char*>p + BLOCK_HEAD


cdef int buf_append(Conn* c, Buf* b, const uint8_t* data, size_t n) noexcept nogil:
    cdef size_t cap
    cdef uint8_t* p
    if b.len + n > b.cap:
        cap = b.cap * 2 if b.cap else 256
        if cap < b.len + n:
            cap = b.len + n
        p = <uint8_t*>conn_realloc(b.data, cap, c)
        if p == NULL:
            return -1
        b.data = p
        b.cap = cap
    memcpy(b.data + b.len, data, n)
    b.len += n
    return 0


cdef void buf_free(Conn* c, Buf* b) noexcept nogil:
    conn_free(b.data, c)
    b.data = NULL
    b.len = b.cap = 0


# ---- protobuf wire format and the messages' codecs: _grpc_codec.pxi ---------------------

include "_grpc_codec.pxi"


def percent_encode(bytes text):
    """grpc-message's encoding: bytes outside printable ASCII, and %, as %XX."""
    return b"".join(bytes([c]) if 0x20 <= c <= 0x7e and c != 0x25 else b"%%%02X" % c
                    for c in text)


# ---- HTTP/2 --------------------------------------------------------------------------------

cdef nghttp2_session_callbacks* CALLBACKS = NULL
cdef nghttp2_option* OPTION = NULL

cdef nghttp2_nv RESPONSE_HEADERS[2]
cdef nghttp2_nv TRAILER_OK[1]
cdef char STATUS_TEXT[17][4]


cdef void static_nv(nghttp2_nv* nv, const char* name, const char* value) noexcept nogil:
    nv.name = <uint8_t*>name
    nv.namelen = strlen(name)
    nv.value = <uint8_t*>value
    nv.valuelen = strlen(value)
    nv.flags = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE


cdef inline bint equals(const uint8_t* s, size_t n, const char* literal, size_t m) noexcept nogil:
    return n == m and memcmp(s, literal, m) == 0


cdef inline Stream* stream_of(nghttp2_session* session, int32_t stream_id) noexcept nogil:
    return <Stream*>nghttp2_session_get_stream_user_data(session, stream_id)


cdef int queue_ready(Conn* c, Stream* s) noexcept nogil:
    """Marks s to be answered once nghttp2 has read the whole chunk."""
    cdef int32_t* p
    cdef uint32_t cap
    if s.queued:
        return 0
    if c.nready == c.ready_cap:
        cap = c.ready_cap * 2 if c.ready_cap else 16
        p = <int32_t*>conn_realloc(c.ready, cap * sizeof(int32_t), c)
        if p == NULL:
            return -1
        c.ready = p
        c.ready_cap = cap
    c.ready[c.nready] = s.id
    c.nready += 1
    s.queued = 1
    return 0


cdef inline bint past_request_deadline(const Stream* s, int64_t now) noexcept nogil:
    """Whether s's request is still coming past the time it had to end
    (once it has ended, queue_ready has queued it)."""
    return not s.queued and s.request_deadline_ns != 0 and now >= s.request_deadline_ns


cdef int64_t due(const Stream* s) noexcept nogil:
    """When an unanswered call must be answered (0: never, or answered):
    its deadline, or its request's if that comes first."""
    cdef int64_t at
    if s.answered:
        return 0
    at = s.deadline_ns
    if not s.queued and s.request_deadline_ns and (at == 0 or s.request_deadline_ns < at):
        at = s.request_deadline_ns
    return at


cdef void drop_body(Conn* c, Stream* s) noexcept nogil:
    """Frees a call's request: once it is answered nothing reads it."""
    c.buffered -= s.body.len
    buf_free(c, &s.body)


cdef void refuse_early(Conn* c, Stream* s, int status, const char* message) noexcept nogil:
    """A call that fails before its request is complete: its bytes go at
    once, the answer after this read."""
    s.status = status
    s.message = message
    drop_body(c, s)
    if queue_ready(c, s) != 0:
        c.out_of_memory = 1


cdef bint parse_timeout(const uint8_t* v, size_t n, int64_t* ns) noexcept nogil:
    """grpc-timeout: at most 8 digits and a unit (H M S m u n)."""
    cdef int64_t amount = 0
    cdef size_t i
    cdef int64_t scale
    cdef uint8_t unit
    if n < 2 or n > 9:
        return False
    for i in range(n - 1):
        if not (c'0' <= v[i] <= c'9'):
            return False
        amount = amount * 10 + (v[i] - c'0')
    unit = v[n - 1]
    if unit == c'H':
        scale = <int64_t>3600 * 1000000000
    elif unit == c'M':
        scale = <int64_t>60 * 1000000000
    elif unit == c'S':
        scale = 1000000000
    elif unit == c'm':
        scale = 1000000
    elif unit == c'u':
        scale = 1000
    elif unit == c'n':
        scale = 1
    else:
        return False
    ns[0] = amount * scale      # at most 99999999 hours: fits
    return True


cdef int on_begin_headers(nghttp2_session* session, const nghttp2_frame* frame,
                          void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef Stream* s
    if frame.hd.type != NGHTTP2_HEADERS or frame.headers.cat != NGHTTP2_HCAT_REQUEST:
        return 0
    s = <Stream*>conn_calloc(1, sizeof(Stream), c)
    if s == NULL:
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    s.id = frame.hd.stream_id
    s.started_ns = fl_mono_ns()
    if c.limits.deadline_ns:
        s.deadline_ns = s.started_ns + c.limits.deadline_ns
        s.deadline_status = GRPC_UNAVAILABLE
    if c.limits.client_wait_ns:
        s.request_deadline_ns = s.started_ns + c.limits.client_wait_ns
    if nghttp2_session_set_stream_user_data(session, s.id, s) != 0:
        conn_free(s, c)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    s.prev = c.last
    if c.last != NULL:
        c.last.next = s
    else:
        c.first = s
    c.last = s
    c.unanswered += 1
    return 0


cdef int on_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                   size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                   void* ud) noexcept nogil:
    cdef Stream* s
    cdef int64_t timeout
    if frame.hd.type != NGHTTP2_HEADERS or frame.headers.cat != NGHTTP2_HCAT_REQUEST:
        return 0       # a client's trailers: gRPC has none to read
    s = stream_of(session, frame.hd.stream_id)
    if s == NULL:
        return 0
    s.header_bytes += namelen + valuelen + 32
    if s.header_bytes > MAX_HEADER_LIST_BYTES:
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    if equals(name, namelen, ":path", 5):
        if equals(value, valuelen, RLS_PATH_C, RLS_PATH_N):
            s.route = ROUTE_RLS
        elif equals(value, valuelen, HEALTH_PATH_C, HEALTH_PATH_N):
            s.route = ROUTE_HEALTH
    elif equals(name, namelen, ":method", 7):
        s.post = equals(value, valuelen, "POST", 4)
    elif equals(name, namelen, "content-type", 12):
        s.grpc_type = valuelen >= 16 and memcmp(value, "application/grpc", 16) == 0 and (
            valuelen == 16 or value[16] == c'+' or value[16] == c';')
    elif equals(name, namelen, "grpc-timeout", 12):
        if parse_timeout(value, valuelen, &timeout):
            s.client_deadline_ns = s.started_ns + timeout
            if s.deadline_ns == 0 or s.client_deadline_ns < s.deadline_ns:
                s.deadline_ns = s.client_deadline_ns
                s.deadline_status = GRPC_DEADLINE_EXCEEDED
    elif equals(name, namelen, "authorization", 13):
        if s.authorization.len == 0 and buf_append(
                <Conn*>ud, &s.authorization, value, valuelen) != 0:
            return NGHTTP2_ERR_CALLBACK_FAILURE
    elif equals(name, namelen, "grpc-encoding", 13):
        s.compressed_ok = not equals(value, valuelen, "identity", 8)
    return 0


cdef int on_data_chunk_recv(nghttp2_session* session, uint8_t flags, int32_t stream_id,
                            const uint8_t* data, size_t n, void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef Stream* s = stream_of(session, stream_id)
    if s == NULL or s.answered or s.status:
        return 0
    if s.body.len + n > MAX_MESSAGE_BYTES + 5:
        refuse_early(c, s, GRPC_RESOURCE_EXHAUSTED,
                     "the request message is larger than the server's 1 MiB")
    elif c.buffered + n > MAX_CONNECTION_BUFFERED:
        refuse_early(c, s, GRPC_RESOURCE_EXHAUSTED,
                     "the connection holds too many unfinished requests")
    elif buf_append(c, &s.body, data, n) != 0:
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    else:
        c.buffered += n
    return 0


cdef int on_frame_recv(nghttp2_session* session, const nghttp2_frame* frame,
                       void* ud) noexcept nogil:
    cdef Stream* s
    if frame.hd.type == NGHTTP2_SETTINGS:
        (<Conn*>ud).greeted = 1      # nghttp2 takes the magic before any frame
    if (frame.hd.type == NGHTTP2_DATA or frame.hd.type == NGHTTP2_HEADERS) and \
            frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
        s = stream_of(session, frame.hd.stream_id)
        if s != NULL and queue_ready(<Conn*>ud, s) != 0:
            return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int on_frame_send(nghttp2_session* session, const nghttp2_frame* frame,
                       void* ud) noexcept nogil:
    cdef Stream* s
    if frame.hd.type == NGHTTP2_GOAWAY and frame.goaway.error_code != NGHTTP2_NO_ERROR:
        (<Conn*>ud).protocol_error = 1
    elif frame.hd.type == NGHTTP2_HEADERS and frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
        # An answer that went before its request ended: the rest of the request is
        # cut off with RST_STREAM NO_ERROR (RFC 9113 8.1), only now, or nghttp2
        # would send the reset first and drop the answer.
        s = stream_of(session, frame.hd.stream_id)
        if s != NULL and s.cut_off:
            s.cut_off = 0
            nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s.id, NGHTTP2_NO_ERROR)
    return 0


cdef int on_stream_close(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                         void* ud) noexcept nogil:
    cdef Conn* c = <Conn*>ud
    cdef Stream* s = stream_of(session, stream_id)
    if s == NULL:
        return 0
    if not s.answered:
        c.unanswered -= 1
    release_stream(c, s)
    return 0


cdef void release_stream(Conn* c, Stream* s) noexcept nogil:
    if s.prev != NULL:
        s.prev.next = s.next
    else:
        c.first = s.next
    if s.next != NULL:
        s.next.prev = s.prev
    else:
        c.last = s.prev
    drop_body(c, s)
    c.unsent -= s.reply.len - s.reply_sent
    buf_free(c, &s.reply)
    buf_free(c, &s.authorization)
    conn_free(s, c)


cdef ssize_t read_reply(nghttp2_session* session, int32_t stream_id, uint8_t* buf,
                        size_t length, uint32_t* data_flags, nghttp2_data_source* source,
                        void* ud) noexcept nogil:
    """The response message as DATA, then grpc-status 0 as trailers; the
    message is freed once it is all out."""
    cdef Conn* c = <Conn*>ud
    cdef Stream* s = <Stream*>source.ptr
    cdef size_t n = s.reply.len - s.reply_sent
    if n > length:
        n = length
    memcpy(buf, s.reply.data + s.reply_sent, n)
    s.reply_sent += n
    c.unsent -= n
    c.reply_moved = 1
    if s.reply_sent == s.reply.len:
        data_flags[0] |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM
        if nghttp2_submit_trailer(session, stream_id, TRAILER_OK, 1) != 0:
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
        buf_free(c, &s.reply)
        s.reply_sent = 0
    return <ssize_t>n


cdef void init_nghttp2() noexcept:
    global CALLBACKS, OPTION
    cdef int i
    nghttp2_session_callbacks_new(&CALLBACKS)
    nghttp2_session_callbacks_set_on_begin_headers_callback(CALLBACKS, on_begin_headers)
    nghttp2_session_callbacks_set_on_header_callback(CALLBACKS, on_header)
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(CALLBACKS, on_data_chunk_recv)
    nghttp2_session_callbacks_set_on_frame_recv_callback(CALLBACKS, on_frame_recv)
    nghttp2_session_callbacks_set_on_frame_send_callback(CALLBACKS, on_frame_send)
    nghttp2_session_callbacks_set_on_stream_close_callback(CALLBACKS, on_stream_close)
    nghttp2_option_new(&OPTION)
    # no priority tree of closed streams: nothing here uses priorities
    nghttp2_option_set_no_closed_streams(OPTION, 1)
    static_nv(&RESPONSE_HEADERS[0], ":status", "200")
    static_nv(&RESPONSE_HEADERS[1], "content-type", "application/grpc")
    static_nv(&TRAILER_OK[0], "grpc-status", "0")
    for i in range(17):
        if i < 10:
            STATUS_TEXT[i][0] = c'0' + i
            STATUS_TEXT[i][1] = 0
        else:
            STATUS_TEXT[i][0] = c'1'
            STATUS_TEXT[i][1] = c'0' + i - 10
            STATUS_TEXT[i][2] = 0


init_nghttp2()
if CALLBACKS == NULL or OPTION == NULL:
    raise MemoryError()


cdef class GrpcShared:
    def __init__(self, ServerCore core, front):
        """front: the event-loop layer's side (server/grpc/listener.py)."""
        self.core = core
        self.front = front
        self.app = None
        self.loop = None
        self.limits.max_streams = 100
        self.limits.max_descriptors = 256
        self.limits.deadline_ns = 15 * 1000000
        self.connections = set()
        self.endpoint_stats = {name: Command(name, 0) for name in ENDPOINT_NAMES}
        self.rls_stats = self.endpoint_stats["should_rate_limit"]
        self.health_stats = self.endpoint_stats["health_check"]
        self.other_stats = self.endpoint_stats["unimplemented"]
        self.total_connections = self.rejected_connections = self.protocol_errors = 0
        self.deferred_calls = self.stall_timeouts = self.output_limit_disconnections = 0
        self.request_timeouts = 0

    @property
    def max_streams(self):
        return self.limits.max_streams

    @max_streams.setter
    def max_streams(self, uint32_t n):
        self.limits.max_streams = n

    @property
    def max_descriptors(self):
        return self.limits.max_descriptors

    @max_descriptors.setter
    def max_descriptors(self, uint32_t n):
        self.limits.max_descriptors = n

    @property
    def client_wait_s(self):
        return self.limits.client_wait_ns / 1e9

    @client_wait_s.setter
    def client_wait_s(self, double seconds):
        self.limits.client_wait_ns = <int64_t>(seconds * 1e9)

    @property
    def deadline_ns(self):
        return self.limits.deadline_ns

    @deadline_ns.setter
    def deadline_ns(self, int64_t ns):
        self.limits.deadline_ns = ns

    @property
    def memory(self):
        """Bytes the connections hold in C (nghttp2's and the calls')."""
        return self.totals.memory


cdef class GrpcConnection:
    def __cinit__(self):
        if writer_init(&self.out, 4096) != 0:
            raise MemoryError()

    def __init__(self, GrpcShared shared):
        cdef nghttp2_mem mem
        cdef nghttp2_settings_entry settings[2]
        self.shared = shared
        self.c.limits = &shared.limits
        self.c.totals = &shared.totals
        mem.mem_user_data = &self.c
        mem.malloc = conn_malloc
        mem.free = conn_free
        mem.calloc = conn_calloc
        mem.realloc = conn_realloc
        if nghttp2_session_server_new3(&self.c.session, CALLBACKS, &self.c, OPTION, &mem) != 0:
            self.c.session = NULL
            raise MemoryError()
        settings[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        settings[0].value = shared.limits.max_streams
        settings[1].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        settings[1].value = MAX_HEADER_LIST_BYTES
        if nghttp2_submit_settings(self.c.session, NGHTTP2_FLAG_NONE, settings, 2) != 0:
            raise MemoryError()

    def __dealloc__(self):
        self.release()
        writer_free(&self.out)

    cdef void release(self) noexcept:
        """Frees the session and every stream (nghttp2 closes none of them
        when it is deleted)."""
        if self.c.session != NULL:
            nghttp2_session_del(self.c.session)
            self.c.session = NULL
        while self.c.first != NULL:
            release_stream(&self.c, self.c.first)
        conn_free(self.c.ready, &self.c)
        self.c.ready = NULL
        self.c.nready = self.c.ready_cap = self.c.unanswered = 0

    # ---- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport):
        cdef GrpcShared shared = self.shared
        self.transport = transport
        shared.total_connections += 1
        if shared.core.refuses(transport):
            # last stream 0: nothing was processed, the client may retry elsewhere
            shared.rejected_connections += 1
            nghttp2_submit_goaway(self.c.session, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR,
                                  <const uint8_t*>"too many connections", 20)
            self.flush()
            self.close_transport()
            return
        shared.connections.add(self)
        if shared.limits.client_wait_ns:
            # an idle connection that did greet is Envoy's normal (one per
            # worker, for hours); one that never did only holds a slot
            self.greeting_timer = shared.loop.call_later(shared.client_wait_s,
                                                         self.greeting_expired)
        self.flush()

    def greeting_expired(self):
        self.greeting_timer = None
        if not self.closed and not self.c.greeted:
            self.shared.greeting_timeouts += 1
            self.close_transport()

    def connection_lost(self, exc):
        self.closed = True
        self.shared.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.greeting_timer is not None:
            self.greeting_timer.cancel()
            self.greeting_timer = None
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None
        self.transport = None
        self.release()

    def eof_received(self):
        return False     # the transport closes itself

    def pause_writing(self):
        # A client that does not read its responses stops being read: what it
        # holds is bounded by the transport's high-water mark plus one read.
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self):
        self.paused = False
        self.c.reply_moved = 1          # the socket took what waited
        self.read_again()
        self.watch_output()

    def data_received(self, bytes data):
        cdef ssize_t rv
        if self.closed or self.c.session == NULL:
            return
        rv = nghttp2_session_mem_recv(self.c.session, <const uint8_t*>PyBytes_AS_STRING(data),
                                      PyBytes_GET_SIZE(data))
        if rv < 0:
            # not HTTP/2 (a bad preface), a flood, or out of memory: GOAWAY, close
            self.c.protocol_error = 1
            nghttp2_session_terminate_session(
                self.c.session, NGHTTP2_INTERNAL_ERROR if self.c.out_of_memory
                else NGHTTP2_PROTOCOL_ERROR)
        else:
            self.process_ready()
        if self.c.greeted and self.greeting_timer is not None:
            self.greeting_timer.cancel()
            self.greeting_timer = None
        self.flush()

    # ---- shutdown, by the front ------------------------------------------------------

    def notify_shutdown(self):
        """GOAWAY that says the server is going: calls still run (health
        checks say NOT_SERVING) until goaway()."""
        if self.c.session != NULL and not self.closed:
            nghttp2_submit_shutdown_notice(self.c.session)
            self.flush()

    def goaway(self):
        """The last GOAWAY (no stream past those already seen), then close
        once what is queued is written."""
        if self.c.session != NULL and not self.closed:
            nghttp2_submit_goaway(self.c.session, NGHTTP2_FLAG_NONE,
                                  nghttp2_session_get_last_proc_stream_id(self.c.session),
                                  NGHTTP2_NO_ERROR, NULL, 0)
            self.flush()
        self.close_transport()

    @property
    def unanswered(self):
        """Calls begun and not yet answered."""
        return self.c.unanswered

    @property
    def memory(self):
        return self.c.memory

    # ---- calls -----------------------------------------------------------------------

    cdef void process_ready(self):
        """Answers the calls whose request is complete, in order, until
        TURN_DESCRIPTORS of work; the rest wait for the next turn."""
        cdef uint32_t i = 0
        cdef uint32_t left
        cdef int work = 0
        cdef Stream* s
        cdef int64_t now = fl_mono_ns()
        while i < self.c.nready and work < TURN_DESCRIPTORS:
            s = stream_of(self.c.session, self.c.ready[i])
            i += 1
            if s != NULL and not s.answered:
                work += self.answer(s, now)
        left = self.c.nready - i
        memmove(self.c.ready, self.c.ready + i, left * sizeof(int32_t))
        self.c.nready = left
        if left:
            self.shared.deferred_calls += left
            self.defer()
        if self.c.unanswered:
            self.arm_timer(now)

    cdef void defer(self):
        """Stops reading until next_turn has answered the calls left."""
        if self.deferred or self.closed:
            return
        self.deferred = True
        self.transport.pause_reading()
        self.shared.loop.call_soon(self.next_turn)

    def next_turn(self):
        self.deferred = False
        if self.closed:
            return
        self.process_ready()
        self.flush()
        self.read_again()

    cdef void read_again(self):
        """Reads again once neither a client that does not read nor calls
        left from a turn hold the reading."""
        if not self.paused and not self.deferred and not self.closed \
                and self.transport is not None:
            self.transport.resume_reading()

    cdef int answer(self, Stream* s, int64_t now) except -1:
        """Answers one call: its error if one is known already, else the
        method's answer; counted per method.  Returns its work: the
        descriptors answered, at least 1."""
        cdef GrpcShared shared = self.shared
        cdef Command stats = (shared.rls_stats if s.route == ROUTE_RLS else
                              shared.health_stats if s.route == ROUTE_HEALTH else
                              shared.other_stats)
        cdef const uint8_t* body = s.body.data
        cdef size_t n = s.body.len
        cdef size_t length
        cdef int work = 1
        if s.status:
            self.fail(s, s.status, s.message)
        elif s.deadline_ns and now >= s.deadline_ns:
            if s.deadline_status == GRPC_DEADLINE_EXCEEDED:
                self.fail(s, GRPC_DEADLINE_EXCEEDED, "deadline exceeded")
            else:
                self.fail(s, GRPC_UNAVAILABLE,
                          "the server could not answer within grpc-deadline-ms")
        elif past_request_deadline(s, now):
            shared.request_timeouts += 1
            self.fail(s, GRPC_UNAVAILABLE, "the request did not end within http-header-timeout")
        elif not s.post:
            self.fail(s, GRPC_UNIMPLEMENTED, "gRPC calls are POST", 405)
        elif not s.grpc_type:
            self.fail(s, GRPC_INTERNAL, "content-type must be application/grpc", 415)
        elif s.route == ROUTE_UNKNOWN:
            self.fail(s, GRPC_UNIMPLEMENTED, "unknown service or method")
        elif s.route == ROUTE_RLS and (user := self.caller(s)) is None:
            self.fail(s, GRPC_UNAUTHENTICATED, "NOAUTH this server needs a password: "
                      "authorization: Bearer <password> or Basic <user:password>")
        elif n == 0:
            self.fail(s, GRPC_INTERNAL, "the request has no message")
        elif n < 5:
            self.fail(s, GRPC_INTERNAL, "the request message is truncated")
        else:
            length = (<size_t>body[1] << 24) | (<size_t>body[2] << 16) | \
                     (<size_t>body[3] << 8) | body[4]
            if n < length + 5:
                self.fail(s, GRPC_INTERNAL, "the request message is truncated")
            elif n > length + 5:
                self.fail(s, GRPC_INTERNAL, "a unary call takes one request message")
            elif body[0] != 0:
                if body[0] == 1 and s.compressed_ok:
                    self.fail(s, GRPC_UNIMPLEMENTED, "compressed messages are not supported")
                else:
                    self.fail(s, GRPC_INTERNAL, "the message's compressed flag is invalid")
            else:
                try:
                    if s.route == ROUTE_RLS:
                        work = self.rate_limit(s, body + 5, length, user)
                    else:
                        self.health(s, body + 5, length)
                except Exception:
                    # A bug, not the client's fault: it gets INTERNAL, the log the trace.
                    shared.core.log.exception("gRPC %s failed", stats.name)
                    if not s.answered:
                        self.fail(s, GRPC_INTERNAL, "the server failed; see its log")
        drop_body(&self.c, s)
        record_call(stats, fl_mono_ns() - now)
        if s.status:
            stats.failed_calls += 1
        return work

    cdef object caller(self, Stream* s):
        """The ACL user a ShouldRateLimit call runs as, as the HTTP front
        finds it: "Bearer <the default user's password>" or Basic
        base64(user:password) (a name that is no user is the default
        user's); None if it needs a password and gave none that works.
        With no password on the default user, a call needs none."""
        core = self.shared.core
        user = self.user_of(s) if s.authorization.len else None
        if user is None and not core.auth_required:
            return core.default_user
        return user

    cdef object user_of(self, Stream* s):
        """The user s's authorization header names, asked of the users
        (Acl.authenticate) unless it is the header this connection asked
        about last and the users have not changed since."""
        acl = self.shared.app.acl
        cdef bytes known = self.known_authorization
        if known is not None and self.known_version == acl.version and equals(
                s.authorization.data, s.authorization.len, PyBytes_AS_STRING(known),
                PyBytes_GET_SIZE(known)):
            return self.known_user
        header = PyBytes_FromStringAndSize(<const char*>s.authorization.data,
                                           s.authorization.len)
        pair = credentials(header)
        user = acl.authenticate(pair[0] if pair[0] in acl.users else "default", pair[1]) \
            if pair is not None else None
        if user is None:
            self.shared.app.auth_failures += 1
        self.known_authorization, self.known_user, self.known_version = \
            header, user, acl.version
        return user

    cdef bint may_check(self, Stream* s, object user, bytes domain) except -1:
        """Whether user may have a descriptor of domain counted: as CL.LIMIT
        on the key domain (+@ratelimit, and a key pattern such as ~edge*),
        refused with PERMISSION_DENIED and logged in ACL LOG otherwise."""
        grant = user.grant
        if grant is None:
            return True
        core = self.shared.core
        cmd = core.commands[b"cl.limit"]
        pos = acl_check(grant, cmd, [b"cl.limit", domain])
        if pos == 0:
            return True
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        reason, obj = ("command", cmd.name) if pos < 0 else \
            ("key", domain.decode("utf-8", "surrogateescape"))
        self.shared.app.acl.log_denial(None, reason, obj, False, username=user.name,
                                       client_info=f"addr={peer_text(peer)} front=grpc")
        self.fail_text(s, GRPC_PERMISSION_DENIED,
                       "NOPERM this user has no permissions to run the 'cl.limit' command"
                       if pos < 0 else "NOPERM this user has no permissions to access one "
                       "of the keys used as arguments")
        return False

    cdef int rate_limit(self, Stream* s, const uint8_t* msg, size_t n, object user) except -1:
        """Answers a ShouldRateLimit call; returns its work: the descriptors
        it had (at least 1)."""
        cdef GrpcShared shared = self.shared
        cdef RlsRequest req
        cdef RlsOutcome out
        cdef int rc = decode_request(msg, n, shared.limits.max_descriptors, &req)
        cdef int work = max(1, req.ndescriptors)
        if rc == TOO_MANY_DESCRIPTORS:
            self.fail_text(s, GRPC_RESOURCE_EXHAUSTED, "the request has more descriptors "
                           f"than grpc-max-descriptors ({shared.limits.max_descriptors})")
            return shared.limits.max_descriptors
        if rc == TOO_MANY_ENTRIES:
            self.fail_text(s, GRPC_RESOURCE_EXHAUSTED,
                           f"a descriptor has more than {MAX_DESCRIPTOR_ENTRIES} entries")
            return 1
        if rc == NO_MEMORY:
            raise MemoryError()
        if rc != 0:
            self.fail(s, GRPC_INTERNAL, "the RateLimitRequest cannot be parsed")
            return 1
        if user.grant is not None and not self.may_check(
                s, user, PyBytes_FromStringAndSize(req.domain.p, req.domain.n)):
            return work
        try:
            shared.decider.decide(&req, &out)
        except RlsError as e:
            self.fail_text(s, GRPC_UNKNOWN, str(e))
            return work
        except RlsHome as e:     # another region decides: answered when it has
            task = asyncio.ensure_future(shared.app.regions_sync.ask_home_rls(
                e.home, *request_objects(&req)))
            task.add_done_callback(functools.partial(self.home_answered, s.id, e.home))
            return work
        if self.answerable(s):
            self.start_message()
            encode_response(&MSG, &out, shared.decider.headers_of(&shared.decider.last, &out))
            self.send_message(s)
        return work

    def home_answered(self, int32_t stream_id, int home, task):
        """The decision of a call another region made (RlsHome), sent on
        its stream if the call is still waiting for it; UNAVAILABLE if that
        region did not answer in time (Envoy's failure_mode_deny decides)."""
        cdef Stream* s
        if self.closed or self.c.session == NULL:
            return
        s = stream_of(self.c.session, stream_id)
        if s == NULL or s.answered:       # reset, or failed at its deadline meanwhile
            return
        try:
            decision = task.result()
        except Exception as e:      # the home's error reply
            self.fail_text(s, GRPC_UNKNOWN, str(e))
        else:
            if decision is None:
                self.fail_text(s, GRPC_UNAVAILABLE, f"home region "
                               f"{self.shared.app.regions.names[home]} did not answer")
            else:
                self.send_decision(s, decision[0], decision[1], decision[2])
        self.flush()

    cdef void send_decision(self, Stream* s, int overall, list statuses, list headers) except *:
        """The RateLimitResponse of a decision as Python objects (another
        region's), unless the client stopped waiting for it."""
        if self.answerable(s):
            self.start_message()
            encode_decision(&MSG, overall, statuses, headers)
            self.send_message(s)

    cdef bint answerable(self, Stream* s) except -1:
        """Whether the client still waits for s's answer (else it gets
        DEADLINE_EXCEEDED: never an answer it has stopped waiting for)."""
        if s.client_deadline_ns and fl_mono_ns() >= s.client_deadline_ns:
            self.fail(s, GRPC_DEADLINE_EXCEEDED, "deadline exceeded")
            return False
        return True

    cdef int start_message(self) except -1:
        """MSG emptied, with room for the gRPC frame's 5-byte header."""
        writer_reset(&MSG)
        if write_raw(&MSG, "\0\0\0\0\0", 5) != 0:
            raise MemoryError()
        return 0

    cdef int send_message(self, Stream* s) except -1:
        """MSG, framed, as s's reply."""
        cdef size_t frame_length = MSG.len - 5
        cdef uint8_t* frame = <uint8_t*>MSG.buf
        frame[1] = <uint8_t>(frame_length >> 24)
        frame[2] = <uint8_t>(frame_length >> 16)
        frame[3] = <uint8_t>(frame_length >> 8)
        frame[4] = <uint8_t>frame_length
        if buf_append(&self.c, &s.reply, frame, MSG.len) != 0:
            raise MemoryError()
        self.reply(s)
        return 0

    cdef int health(self, Stream* s, const uint8_t* msg, size_t n) except -1:
        cdef Reader service
        cdef uint8_t reply[7]
        if decode_health_request(msg, n, &service) != 0:
            self.fail(s, GRPC_INTERNAL, "the HealthCheckRequest cannot be parsed")
            return 0
        # the server (""), the service by its gRPC name, and "ratelimit",
        # the name the reference registers (health checks written for it ask it)
        if service.p != service.end and not equals(
                service.p, service.end - service.p, RLS_SERVICE_C, RLS_SERVICE_N) and \
                not equals(service.p, service.end - service.p, "ratelimit", 9):
            self.fail(s, GRPC_NOT_FOUND, "unknown service")
            return 0
        # HealthCheckResponse {1 status}, framed
        reply[0] = 0
        reply[1] = reply[2] = reply[3] = 0
        reply[4] = 2
        reply[5] = 1 << 3 | WT_VARINT
        reply[6] = HEALTH_NOT_SERVING if self.shared.draining else HEALTH_SERVING
        if buf_append(&self.c, &s.reply, reply, 7) != 0:
            raise MemoryError()
        self.reply(s)
        return 0

    cdef void reply(self, Stream* s):
        """HEADERS, the message in s.reply, and grpc-status 0 as trailers."""
        cdef nghttp2_data_provider provider
        provider.source.ptr = s
        provider.read_callback = read_reply
        s.answered = 1
        self.c.unanswered -= 1
        self.c.unsent += s.reply.len
        if nghttp2_submit_response(self.c.session, s.id, RESPONSE_HEADERS, 2, &provider) != 0:
            nghttp2_submit_rst_stream(self.c.session, NGHTTP2_FLAG_NONE, s.id,
                                      NGHTTP2_INTERNAL_ERROR)

    cdef void fail(self, Stream* s, int status, const char* message, int http_status=200):
        self.fail_with(s, status, message, strlen(message), http_status)

    cdef void fail_text(self, Stream* s, int status, str message):
        cdef bytes encoded = percent_encode(message.encode("utf-8", "replace"))
        self.fail_with(s, status, PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded), 200)

    cdef void fail_with(self, Stream* s, int status, const char* message, size_t length,
                        int http_status):
        """A trailers-only response: HEADERS with grpc-status and
        grpc-message, ending the stream (the rest of a request still coming
        is cut off once it is sent: on_frame_send)."""
        cdef nghttp2_nv nva[4]
        nva[0] = RESPONSE_HEADERS[0]
        if http_status == 405:
            static_nv(&nva[0], ":status", "405")
        elif http_status == 415:
            static_nv(&nva[0], ":status", "415")
        nva[1] = RESPONSE_HEADERS[1]
        static_nv(&nva[2], "grpc-status", STATUS_TEXT[status])
        static_nv(&nva[3], "grpc-message", "")
        nva[3].value = <uint8_t*>message
        nva[3].valuelen = length
        nva[3].flags = NGHTTP2_NV_FLAG_NO_COPY_NAME    # nghttp2 copies the message
        s.status = status
        s.answered = 1
        self.c.unanswered -= 1
        if nghttp2_submit_response(self.c.session, s.id, nva, 4, NULL) != 0:
            nghttp2_submit_rst_stream(self.c.session, NGHTTP2_FLAG_NONE, s.id,
                                      NGHTTP2_INTERNAL_ERROR)
        elif not nghttp2_session_get_stream_remote_close(self.c.session, s.id):
            s.cut_off = 1

    # ---- deadlines -------------------------------------------------------------------

    cdef void arm_timer(self, int64_t now):
        """Wakes expire() at the earliest deadline of the unanswered calls
        (only a call whose request is still coming has one to wait for)."""
        cdef Stream* s = self.c.first
        cdef int64_t earliest = 0
        cdef int64_t at
        while s != NULL:
            at = due(s)
            if at and (earliest == 0 or at < earliest):
                earliest = at
            s = s.next
        if earliest == 0 or (self.timer is not None and self.timer_at <= earliest):
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = earliest
        self.timer = self.shared.loop.call_later(
            (earliest - now) / 1e9 if earliest > now else 0, self.expire)

    def expire(self):
        """Fails the calls whose deadline has come (the loop's timers may
        wake up to a millisecond early)."""
        cdef Stream* s = self.c.first
        cdef int64_t now = fl_mono_ns()
        cdef int64_t at
        self.timer = None
        if self.closed:
            return
        while s != NULL:
            at = due(s)
            if at and at <= now + 1000000:
                self.answer(s, at if at > now else now)
            s = s.next
        self.flush()
        if self.c.unanswered and not self.closed:
            self.arm_timer(now)

    # ---- output ----------------------------------------------------------------------

    cdef void flush(self):
        """Sends every frame nghttp2 has queued, in one write; closes once
        the session has nothing left to read or write."""
        cdef bint failed
        if self.transport is None or self.c.session == NULL or self.closed:
            return
        failed = not self.send_queued()
        if self.c.protocol_error == 1:
            self.c.protocol_error = 2       # counted once
            self.shared.protocol_errors += 1
        if failed or (not nghttp2_session_want_read(self.c.session)
                      and not nghttp2_session_want_write(self.c.session)):
            self.close_transport()
        else:
            self.watch_output()

    cdef bint send_queued(self):
        """Writes what nghttp2 has queued; False if it failed."""
        cdef const uint8_t* data
        cdef ssize_t n
        while True:
            n = nghttp2_session_mem_send(self.c.session, &data)
            if n <= 0:
                break
            if write_raw(&self.out, <const char*>data, n) != 0:
                n = -1
                break
        if self.out.len:
            self.transport.write(PyBytes_FromStringAndSize(self.out.buf, self.out.len))
            writer_reset(&self.out)
        return n >= 0

    cdef void watch_output(self):
        """Bounds the answers waiting for the client to take them (its
        HTTP/2 window shut, or its socket full): what they hold, by
        client-output-buffer-limit's normal class as a RESP client's
        replies, and how long none moves, by client_wait_ns."""
        cdef int64_t now
        if self.closed or self.transport is None:
            return
        if self.over_output_limits(self.transport.get_write_buffer_size() + self.c.unsent):
            return
        if not self.c.unsent and not self.paused:
            self.stalled_since = 0
            return
        now = fl_mono_ns()
        if self.stalled_since == 0 or self.c.reply_moved:
            self.stalled_since = now
        self.c.reply_moved = 0
        if self.stall_timer is None and self.shared.limits.client_wait_ns:
            self.stall_timer = self.shared.loop.call_later(self.shared.client_wait_s,
                                                           self.stall_expired)

    def stall_expired(self):
        cdef int64_t wait = self.shared.limits.client_wait_ns
        cdef int64_t left
        self.stall_timer = None
        if self.closed or self.stalled_since == 0:
            return
        # the loop's timers may wake up to a millisecond early
        left = self.stalled_since + wait - fl_mono_ns()
        if left > 1000000:
            self.stall_timer = self.shared.loop.call_later(left / 1e9, self.stall_expired)
            return
        self.shared.stall_timeouts += 1
        self.drop("answers not taken within http-header-timeout")

    cdef bint over_output_limits(self, int64_t pending):
        """Drops the connection if pending is past the hard limit, or past
        the soft one for its seconds; True if it did."""
        cdef ServerCore core = self.shared.core
        cdef int64_t now
        if core.output_hard_limit > 0 and pending > core.output_hard_limit:
            self.shared.output_limit_disconnections += 1
            self.drop("output over client-output-buffer-limit")
            return True
        if core.output_soft_limit <= 0 or pending <= core.output_soft_limit:
            self.soft_limit_since = 0
            return False
        now = fl_mono_ns()
        if self.soft_limit_since == 0:
            self.soft_limit_since = now
        elif now - self.soft_limit_since > <int64_t>(core.output_soft_seconds * 1e9):
            self.shared.output_limit_disconnections += 1
            self.drop("output over client-output-buffer-limit's soft limit")
            return True
        return False

    cdef void drop(self, const char* why):
        """GOAWAY ENHANCE_YOUR_CALM saying why, then the connection closes:
        at once if the socket does not take the GOAWAY either."""
        self.shared.core.log.warning("closing gRPC client addr=%s: %s",
                                     peer_text(self.transport.get_extra_info("peername")),
                                     why.decode())
        nghttp2_submit_goaway(self.c.session, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(self.c.session),
                              NGHTTP2_ENHANCE_YOUR_CALM, <const uint8_t*>why, strlen(why))
        self.send_queued()
        self.c.protocol_error = 2           # the server's own doing, not counted as one
        if self.transport.get_write_buffer_size():
            self.closed = True
            self.transport.abort()
        else:
            self.close_transport()

    cdef void close_transport(self):
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
