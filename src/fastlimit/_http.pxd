# The HTTP/1.1 front's connection: httptools (llhttp, uvicorn's parser)
# reads the requests; the check endpoints (POST /v1/check, /v1/limits/check,
# /v1/check/bucket, /v1/check/batch) run here on the engine, as CL.LIMIT,
# CL.APPLY and CL.CHECK do on the RESP port, and their responses are
# written in C.  Every other request goes to the event-loop layer's
# handlers (server/http/).  Responses go out in request order, those of
# one turn in one write.  A connection's turn is bounded as RESP's is (by
# bytes of requests and by time): the rest of a read waits, unread, for
# the next turn, and nothing more is answered while the client does not
# read what it was sent.

from libc.stdint cimport int64_t, uint32_t

from fastlimit._core cimport CheckResult
from fastlimit._protocol cimport ServerCore
from fastlimit._resp cimport Writer


cdef class HttpShared:
    """What every HTTP connection shares: the engine, the bounds (from the
    settings), the counters and the front that routes the rest."""
    cdef readonly ServerCore core
    cdef readonly object front
    cdef readonly object response_type
    cdef public size_t max_header_bytes
    cdef public int max_headers
    cdef public size_t max_body_bytes
    cdef public int64_t header_timeout_ns
    cdef public int64_t body_timeout_ns   # a request's body arrives within this of its headers
    cdef public int64_t body_memory       # bound of body_bytes (http-body-memory)
    cdef readonly int64_t body_bytes      # request bodies buffered, all connections together
    cdef public Py_ssize_t batch_max
    cdef public bint metrics_auth
    cdef bytes date                   # the Date header line, set once a second
    cdef readonly set connections
    cdef readonly dict endpoint_stats # name -> Command (calls, nsec, failed_calls)
    cdef list fast_stats              # by Endpoint
    cdef dict rule_info               # rule number -> describe_rule's tuple
    cdef object rules_version         # the registry's version rule_info is of
    cdef public int64_t total_requests
    cdef public int64_t total_connections
    cdef public int64_t rejected_connections
    cdef public int64_t bad_requests

    cdef tuple describe_rule(self, uint32_t num)


cdef class HttpConnection:
    cdef HttpShared shared
    cdef ServerCore core
    cdef object transport
    cdef object parser
    cdef Writer out               # responses of this read, sent with one write
    cdef list pending             # after a response that waits: bytes or tasks, in order
    cdef bytes inbuf              # a read whose inpos.. the last turn's budget left unparsed
    cdef Py_ssize_t inpos
    cdef bint turn_scheduled      # next_turn is due on the loop
    cdef bint reading             # the transport is not paused
    cdef bint writing_paused      # the unsent output is past the transport's high-water mark
    cdef int64_t stalled_since    # when writing paused
    # the request being read
    cdef bytes url
    cdef list headers             # [(lowercase name, value)]
    cdef bytes authorization
    cdef bytes expect
    cdef int host_lines
    cdef bint connection_header   # it has one
    cdef list body
    cdef size_t body_len
    cdef size_t header_bytes
    cdef int nheaders
    cdef bint started             # a byte of it has arrived
    cdef int64_t ready_since      # when the wait for the client's next bytes began; 0: none
    cdef int64_t body_since       # when its body began (headers complete); 0: none
    cdef object refusal           # the response a bound stopped the parser with
    cdef bint closing
    cdef bint closed
    # the Authorization value last accepted, and the password it matched
    cdef bytes authorized_header
    cdef object authorized_for    # (ACL version, user) the cached header is of
    cdef object user              # the ACL user of the request being answered

    cdef void feed(self, bytes data, Py_ssize_t pos)
    cdef bint waits(self)
    cdef void go_on(self)
    cdef void update_reading(self)
    cdef void check_framing(self, str version)
    cdef void expectation(self)
    cdef bint body_follows(self)
    cdef void refuse(self, int status, str title, str detail)
    cdef void refuse_with(self, response)
    cdef void reset_request(self)
    cdef void forget_body(self)
    cdef void check_deadline(self, int64_t now_ns)
    cdef void abort(self)
    cdef void dispatch(self, bytes method, bint keep)
    cdef void run_endpoint(self, int endpoint, bytes query, bint keep)
    cdef bint authorized(self, bytes path)
    cdef void permit(self, bytes name, int position, bytes key)
    cdef dict json_body(self)
    cdef void one_check(self, int endpoint, bint enforce, bint keep)
    cdef uint32_t decide(self, int endpoint, dict doc, CheckResult* r)
    cdef uint32_t limit(self, dict doc, CheckResult* r)
    cdef uint32_t apply(self, dict doc, CheckResult* r)
    cdef uint32_t elsewhere(self, list args, bytes client, bytes resource, int64_t cost,
                            CheckResult* r, check) except? 0
    cdef bytes decision_bytes(self, list reply, uint32_t binding, bint enforce, bint keep)
    cdef str home_refusal(self)
    cdef void bucket(self, dict doc, CheckResult* r)
    cdef void route(self, bytes key)
    cdef int asked_priority(self, dict doc) except -2
    cdef int user_priority(self) except -2
    cdef void batch(self, bint keep)
    cdef void write_decision_response(self, const CheckResult* r, uint32_t binding,
                                      bint enforce, bint keep)
    cdef void write_ratelimit_headers(self, const CheckResult* r, tuple info, bint retry_after)
    cdef void write_decision(self, const CheckResult* r, uint32_t binding, tuple info=*)
    cdef void begin_response(self, int status, bytes content_type, bint keep)
    cdef void finish_response(self)
    cdef void send_python(self, response, bint keep, bytes method)
    cdef void queue_task(self, coroutine)
    cdef object waiting_task(self)
    cdef void emit(self, bytes data)
    cdef void fail(self, int status, str title, str detail)
    cdef void fail_with(self, response)
    cdef void write_out(self)
    cdef void flush(self)
    cdef bint over_output_limit(self)
