"""The HTTP/1.1 front's connection; see _http.pxd."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint32_t

from fastlimit._core cimport BucketParams, CheckResult, fl_mono_ns
from fastlimit._protocol cimport (ServerCore, Command, check_bucket, check_limit, record_call,
                                  acl_verdict)
from fastlimit._resp cimport Arg
from fastlimit._rules cimport FL_SPLIT_MAX
from fastlimit._load cimport (FL_PRIO_UNSET, FL_PRIO_NORMAL, FL_SHED_REMAINING,
                              FL_SHED_RETRY_MS)
from fastlimit._load import PRIORITIES, priority_value
from fastlimit._protocol import HOME_ELSEWHERE, SLICE_BUDGET_S, credentials, peer_text
from fastlimit._rules import HomeElsewhere
from fastlimit._resp cimport (Writer, writer_init, writer_free, writer_reset, write_raw,
                              write_decimal)

import asyncio
import json

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser

from fastlimit.rules.model import NESTED_TOO_DEEPLY, no_duplicate_keys

# A response's body is made here first, so its length leads it.  The server
# is single-threaded and a response is made to completion before the next.
cdef Writer BODY
if writer_init(&BODY, 4096) != 0:
    raise MemoryError()

# A connection's requests are answered this many bytes of them per
# event-loop turn, then the other clients get theirs, as RESP's TURN_BYTES
# (_protocol.pyx); and for no longer than a sliced reply's share of a turn,
# since one request may cost milliseconds (/metrics with many rules).
cdef Py_ssize_t TURN_BYTES = 16384
cdef int64_t TURN_NS = <int64_t>(SLICE_BUDGET_S * 1e9)
# Responses made during a turn are written once they are this large (the
# transport's default high-water mark), so a client that does not read is
# seen (pause_writing) before more are made.
cdef Py_ssize_t OUT_WRITE_BYTES = 65536
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# The largest cost a check may ask for: CL.LIMIT's and CL.CHECK's bound.
cdef int64_t MAX_COST = 10 ** 15

REASONS = {200: "OK", 201: "Created", 204: "No Content", 304: "Not Modified",
           400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 412: "Precondition Failed",
           413: "Content Too Large", 415: "Unsupported Media Type", 417: "Expectation Failed",
           421: "Misdirected Request",
           422: "Unprocessable Content", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable",
           505: "HTTP Version Not Supported"}

# The RESP error code of a decision's error, as an HTTP status.
ERROR_STATUS = {"ERR": 400, "READONLY": 503, "OOM": 503, "MOVED": 421, "CLUSTERDOWN": 503,
                "TRYAGAIN": 503, "NOPERM": 403, "HOME": 421}

# The endpoints that run here, without a Python handler.
cdef enum Endpoint:
    EP_NONE = 0
    EP_CHECK = 1          # POST /v1/check: CL.LIMIT
    EP_LIMITS_CHECK = 2   # POST /v1/limits/check: CL.APPLY
    EP_CHECK_BUCKET = 3   # POST /v1/check/bucket: CL.CHECK
    EP_CHECK_BATCH = 4    # POST /v1/check/batch: many of the first two

FAST_ENDPOINTS = {b"/v1/check": EP_CHECK, b"/v1/limits/check": EP_LIMITS_CHECK,
                  b"/v1/check/bucket": EP_CHECK_BUCKET, b"/v1/check/batch": EP_CHECK_BATCH}
FAST_ENDPOINT_NAMES = {EP_CHECK: "check", EP_LIMITS_CHECK: "limits_check",
                       EP_CHECK_BUCKET: "check_bucket", EP_CHECK_BATCH: "check_batch"}
# Reachable without credentials: a probe carries none.
OPEN_PATHS = frozenset([b"/livez", b"/healthz", b"/readyz", b"/healthcheck"])


class BadField(Exception):
    """A request document's field that cannot be used: 400 naming it."""

    def __init__(self, field, detail, status=400):
        super().__init__(detail)
        self.field = field
        self.detail = detail
        self.status = status


class Refused(Exception):
    """A request the engine refused: the RESP error text it would give."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error


class Forwarded(Exception):
    """A check another region answers (README, "Home rules"): `answer`
    awaits its reply; `binding` the home rule it names in the response."""

    def __init__(self, answer, binding):
        super().__init__("forwarded to the key's home region")
        self.answer = answer
        self.binding = binding


async def forwarded_response(HttpConnection conn, answer, uint32_t binding, bint enforce,
                             bint keep):
    """The response to a forwarded check, once its home region answered."""
    try:
        reply = await answer
    except Exception as e:      # the home's error reply, as this front words errors
        return conn.shared.front.encode(conn.shared.front.refused(str(e)), keep, False)
    return conn.decision_bytes(reply, binding, enforce, keep)


cdef class HttpShared:
    def __init__(self, ServerCore core, front):
        """front: the event-loop layer's side (server/http/listener.py),
        which routes the other requests and encodes their responses."""
        self.core = core
        self.front = front
        self.max_header_bytes = 16384
        self.max_headers = 100
        self.max_body_bytes = 1024 * 1024
        self.header_timeout_ns = 10 * 1000000000
        self.body_timeout_ns = 60 * 1000000000
        self.body_memory = 64 * 1024 * 1024
        self.body_bytes = 0
        self.batch_max = 1000
        self.metrics_auth = True
        self.date = b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
        self.response_type = front.response_type
        self.connections = set()
        self.rule_info = {}
        self.rules_version = -1
        self.endpoint_stats = {name: Command(name, 0) for name in FAST_ENDPOINT_NAMES.values()}
        self.fast_stats = [None] * 5
        for ep, name in FAST_ENDPOINT_NAMES.items():
            self.fast_stats[ep] = self.endpoint_stats[name]
        self.total_requests = self.total_connections = self.rejected_connections = 0
        self.bad_requests = 0

    def set_date(self, str http_date):
        self.date = f"Date: {http_date}\r\n".encode("ascii")

    def sweep(self):
        """Answers 408 to connections whose request headers are late, and
        closes idle ones that waited as long for their next request (each
        holds a slot of maxclients: slowloris)."""
        cdef int64_t now = fl_mono_ns()
        cdef HttpConnection conn
        for conn in list(self.connections):
            conn.check_deadline(now)

    cdef tuple describe_rule(self, uint32_t num):
        """(id as JSON, RateLimit-Policy item or None, ms until the next
        unit of quota) of rule num, cached until the rules change."""
        registry = self.core.app.rules
        if registry.version != self.rules_version:
            self.rule_info.clear()
            self.rules_version = registry.version
        info = self.rule_info.get(num)
        if info is None:
            info = self.front.describe_rule(num)
            self.rule_info[num] = info
        return info


cdef inline int64_t ceil_seconds(int64_t ms) noexcept:
    return (ms + 999) // 1000 if ms > 0 else 0


cdef inline void write_bytes(Writer* w, bytes b) noexcept:
    write_raw(w, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


cdef str text_field(dict doc, str name, bint required):
    value = doc.get(name)
    if value is None:
        if required:
            raise BadField(name, f"{name} is required")
        return None
    if type(value) is not str:
        raise BadField(name, f"{name} must be a string")
    return value


cdef int64_t integer_field(dict doc, str name, int64_t default, int64_t low,
                           int64_t high) except? -1:
    value = doc.get(name)
    if value is None:
        return default
    # bool is an int in Python, not in JSON
    if type(value) is not int or not low <= value <= high:
        raise BadField(name, f"{name} must be an integer from {low} to {high}")
    return value


# The json module's C scanner: json.loads runs four Python functions
# around it, which cost a check more than everything else it does.  Its
# objects go through the rules' hook, which refuses a key given twice (as
# CL.RULE SET and /json do): a filter that reads the first "cost" must not
# see a different request than the one decided.
_SCAN = json.JSONDecoder(object_pairs_hook=no_duplicate_keys).scan_once


cdef object parse_json(bytes body):
    """A JSON document, as json.loads reads it (UTF-8, surrounding
    whitespace allowed) with no key twice in an object, or BadField."""
    try:
        text = body.decode("utf-8").strip(" \t\n\r")
        doc, end = _SCAN(text, 0)
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    except StopIteration as e:
        raise BadField(None, f"the body is not JSON: Expecting value: char {e.value}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadField(None, f"the body is not JSON: {e}") from None
    except RecursionError:
        raise BadField(None, f"the body is not JSON: {NESTED_TOO_DEEPLY}") from None
    return doc


cdef bytes utf8(str s):
    return s.encode("utf-8", "surrogatepass")


cdef class HttpConnection:
    def __cinit__(self):
        if writer_init(&self.out, 4096) != 0:
            raise MemoryError()

    def __init__(self, HttpShared shared):
        self.shared = shared
        self.core = shared.core
        self.parser = HttpRequestParser(self)
        self.pending = None
        self.reading = True
        self.reset_request()

    def __dealloc__(self):
        writer_free(&self.out)

    # ---- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport):
        cdef HttpShared shared = self.shared
        self.transport = transport
        shared.total_connections += 1
        if self.core.refuses(transport):
            shared.rejected_connections += 1
            self.fail(503, "too many connections", "the server has maxclients "
                      "connections open")
            self.flush()
            return
        shared.connections.add(self)
        self.ready_since = fl_mono_ns()

    def connection_lost(self, exc):
        self.closed = True
        self.shared.connections.discard(self)
        self.forget_body()
        self.inbuf = None
        if self.pending:
            for item in self.pending:
                if not isinstance(item, bytes):
                    item.cancel()
        self.pending = None
        self.transport = None

    def close(self):
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def eof_received(self):
        return False     # the transport closes itself

    def pause_writing(self):
        # A client that does not read its responses gets no more of them
        # made, and is not read: its unsent output stays within the
        # transport's high-water mark plus the responses of one request.
        self.writing_paused = True
        self.stalled_since = fl_mono_ns()
        self.update_reading()

    def resume_writing(self):
        self.writing_paused = False
        self.stalled_since = 0
        self.go_on()

    def data_received(self, bytes data):
        if self.closing:
            return
        self.started = True
        if self.inbuf is not None:
            # read before the pause took effect (TLS): behind what waits
            self.inbuf = self.inbuf[self.inpos:] + data
            self.inpos = 0
            return
        self.feed(data, 0)

    def next_turn(self):
        """This connection's next share of the loop: the requests left
        unparsed when its last turn's budget ran out."""
        self.turn_scheduled = False
        if self.inbuf is None or self.closed or self.waits():
            return
        data, self.inbuf = self.inbuf, None
        self.feed(data, self.inpos)

    # ---- turns ---------------------------------------------------------------------

    cdef void feed(self, bytes data, Py_ssize_t pos):
        """Parses and answers data[pos:] until this turn's budget is spent
        (TURN_BYTES of requests or TURN_NS of the loop's time) or something
        waits (a handler's task, a client that does not read); the rest is
        kept, unread, for the next turn (checked between requests).  The
        parser is fed one piece at a time, each holding at most one blank
        line that is not its last bytes, so that at most two requests
        complete in a piece (a body's end and one head) and the turn can
        stop between them: llhttp cannot be paused through httptools."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t stop = pos + TURN_BYTES
        cdef Py_ssize_t end
        cdef int64_t t0 = fl_mono_ns()
        view = None
        try:
            while pos < n and not self.waits():
                # between requests only: one request's head and body go together
                if self.url is None and (pos >= stop or fl_mono_ns() - t0 > TURN_NS):
                    self.inbuf, self.inpos = data, pos
                    break
                end = data.find(b"\r\n\r\n", pos)
                if end >= 0 and data.find(b"\r\n\r\n", end + 4) >= 0:
                    end += 4
                else:
                    end = n    # one head at most ends in the rest: one piece
                if pos == 0 and end == n:
                    self.parser.feed_data(data)     # the usual read: one request
                else:
                    if view is None:
                        view = memoryview(data)
                    self.parser.feed_data(view[pos:end])
                pos = end
                if self.out.len >= OUT_WRITE_BYTES:
                    self.write_out()                # may pause writing
            else:
                if pos < n and not self.closing:
                    self.inbuf, self.inpos = data, pos
        except HttpParserUpgrade:
            # The request was answered as if Upgrade were not there (RFC 9110
            # lets a server ignore it); what follows would be another protocol.
            self.closing = True
        except HttpParserError as e:
            if self.refusal is not None:
                self.fail_with(self.refusal)
            else:
                self.shared.bad_requests += 1
                self.fail(400, "malformed request", str(e) or "the request cannot be parsed")
        if self.closing:
            self.inbuf = None
        self.flush()

    cdef bint waits(self):
        """Whether answering more must wait: for a handler's task (whose
        response goes first), or for the client to read what it was sent."""
        return self.pending is not None or self.writing_paused or self.closing

    cdef void go_on(self):
        """After what waited is done: the unparsed rest on the next turn,
        or reading again."""
        if self.closing or self.closed:
            return
        if self.inbuf is not None and not self.waits() and not self.turn_scheduled:
            self.turn_scheduled = True
            asyncio.get_running_loop().call_soon(self.next_turn)
        self.update_reading()

    cdef void update_reading(self):
        """Reads the client while nothing of its input waits."""
        cdef bint want = self.inbuf is None and not self.waits()
        if want == self.reading or self.transport is None:
            return
        self.reading = want
        if want:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    # ---- httptools' callbacks ------------------------------------------------------

    def on_message_begin(self):
        self.started = True

    def on_url(self, bytes url):
        self.header_bytes += PyBytes_GET_SIZE(url)
        if self.header_bytes > self.shared.max_header_bytes:
            self.refuse(431, "request header fields too large",
                        f"the request line and headers exceed {self.shared.max_header_bytes} "
                        f"bytes")
        self.url = url if self.url is None else self.url + url

    def on_header(self, bytes name, bytes value):
        cdef HttpShared shared = self.shared
        self.header_bytes += PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + 4
        self.nheaders += 1
        if self.header_bytes > shared.max_header_bytes or self.nheaders > shared.max_headers:
            self.refuse(431, "request header fields too large",
                        f"at most {shared.max_headers} headers and {shared.max_header_bytes} "
                        f"bytes of request line and headers")
        name = name.lower()
        if name == b"authorization":
            self.authorization = value
        elif name == b"host":
            self.host_lines += 1
        elif name == b"expect":
            self.expect = value
        elif name == b"connection":
            self.connection_header = True
        elif name == b"content-length" and value.strip().isdigit() and \
                int(value) > shared.max_body_bytes:
            # refused now, not after reading up to the bound
            self.refuse(413, "content too large",
                        f"the body exceeds {shared.max_body_bytes} bytes")
        self.headers.append((name, value))

    def on_headers_complete(self):
        # the header timeout is met; the body's begin
        self.ready_since = self.body_since = fl_mono_ns()
        # Only HTTP/1.1 (llhttp refuses versions but 0.9, 1.0, 1.1 and 2.0) is
        # kept alive without a Connection header: the usual request is known
        # to be 1.1 without formatting its version.
        if self.host_lines != 1 or self.expect is not None or self.connection_header or \
                not self.parser.should_keep_alive():
            self.check_framing(self.parser.get_http_version())

    def on_body(self, bytes body):
        cdef HttpShared shared = self.shared
        cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
        self.ready_since = fl_mono_ns()      # each read restarts the idle timeout
        if self.body_len + n > shared.max_body_bytes:
            self.refuse(413, "content too large",
                        f"the body exceeds {shared.max_body_bytes} bytes")
        if shared.body_bytes + n > shared.body_memory:
            self.refuse(503, "server busy", f"the request bodies being read exceed "
                        f"http-body-memory ({shared.body_memory} bytes); try again")
        self.body_len += n
        shared.body_bytes += n
        self.body.append(body)

    def on_message_complete(self):
        cdef bint keep = self.parser.should_keep_alive()
        self.shared.total_requests += 1
        self.dispatch(self.parser.get_method(), keep)
        self.reset_request()
        if keep:
            self.ready_since = fl_mono_ns()
        else:
            self.closing = True

    cdef void check_framing(self, str version):
        """RFC 9112's rules for what a request's head must be, and its
        Expect (RFC 9110 §10.1.1), decided before the body is read."""
        if not version.startswith("1."):
            self.refuse(505, "http version not supported",
                        f"HTTP/{version} is not supported: this server speaks HTTP/1.1")
        if self.host_lines > 1 or (self.host_lines == 0 and version != "1.0"):
            self.shared.bad_requests += 1
            self.refuse(400, "bad request", "an HTTP/1.1 request has exactly one Host header "
                        "(RFC 9112 section 3.2)")
        if self.expect is not None and version != "1.0":     # 1.0: ignored (RFC 9110)
            self.expectation()

    cdef void expectation(self):
        """Expect: 100-continue gets the interim 100 before the body is
        read, or the final status when it is known without the body (401
        for missing credentials, 413 was at Content-Length); any other
        expectation gets 417.  Each refusal closes the connection, whether
        or not the client then sends the body."""
        if self.expect.strip().lower() != b"100-continue":
            self.refuse(417, "expectation failed",
                        "the only expectation this server meets is 100-continue")
        if not self.body_follows():
            return
        if not self.authorized((self.url or b"/").partition(b"?")[0]):
            self.refuse_with(self.shared.front.unauthorized())
        self.emit(CONTINUE)

    cdef bint body_follows(self):
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and
                                                value.strip().strip(b"0") != b""):
                return True
        return False

    cdef void refuse(self, int status, str title, str detail):
        """Stops the parser on a bound: feed answers status and closes."""
        self.refuse_with(self.shared.front.problem(status, title, detail))

    cdef void refuse_with(self, response):
        self.refusal = response
        raise OverflowError(response.status)

    cdef void reset_request(self):
        self.forget_body()
        self.url = None
        self.headers = []
        self.authorization = None
        self.expect = None
        self.connection_header = False
        self.host_lines = 0
        self.header_bytes = 0
        self.nheaders = 0
        self.body_since = 0
        self.started = False

    cdef void forget_body(self):
        """The request's body stops counting against http-body-memory."""
        self.shared.body_bytes -= self.body_len
        self.body = []
        self.body_len = 0

    # ---- time limits ---------------------------------------------------------------

    cdef void check_deadline(self, int64_t now_ns):
        """Every phase of the connection that waits on the client has its
        time: its headers http-header-timeout from their first byte, its
        body http-body-timeout in all and http-header-timeout between two
        reads, its next request http-header-timeout, and a client that
        does not read its responses is closed after http-header-timeout
        with no byte taken.  A handler's task is the server's time."""
        cdef HttpShared shared = self.shared
        if self.closing or self.closed or self.pending is not None:
            return
        if self.writing_paused:
            if now_ns - self.stalled_since >= shared.header_timeout_ns:
                self.core.log.warning("closing an HTTP client that has not read its responses "
                                      "for http-header-timeout")
                self.abort()
            return
        if self.body_since and now_ns - self.body_since >= shared.body_timeout_ns:
            self.fail(408, "request timeout", "the request's body did not arrive within "
                      "http-body-timeout")
            self.flush()
            return
        if self.ready_since == 0 or now_ns - self.ready_since < shared.header_timeout_ns:
            return
        if self.started:
            self.fail(408, "request timeout", "the request did not arrive in time (each of "
                      "its reads is due within http-header-timeout)")
            self.flush()
        elif self.transport is not None:
            self.closing = True
            self.transport.close()

    cdef void abort(self):
        """Drops the connection now, with whatever output is unsent."""
        self.closing = True
        self.inbuf = None
        if self.transport is not None:
            self.transport.abort()

    # ---- dispatch --------------------------------------------------------------------

    cdef void dispatch(self, bytes method, bint keep):
        cdef bytes url = self.url or b"/"
        cdef bytes path, query
        cdef size_t mark = self.out.len
        path, _, query = url.partition(b"?")
        try:
            if not self.authorized(path):
                self.send_python(self.shared.front.unauthorized(), keep, method)
            elif method == b"POST" and path in FAST_ENDPOINTS:
                self.run_endpoint(FAST_ENDPOINTS[path], query, keep)
                if self.pending is not None:
                    # after a response that waits: this one waits behind it
                    self.pending.append(PyBytes_FromStringAndSize(self.out.buf + mark,
                                                                  self.out.len - mark))
                    self.out.len = mark
            elif self.waiting_task() is not None:
                # behind a request that waits (a rule change through the
                # store): handled once it is done, so a GET sees a PUT before it
                self.send_python(self.shared.front.after(
                    self.waiting_task(), self.user, method, path, query, self.headers,
                    b"".join(self.body)), keep, method)
            else:
                response = self.shared.front.route_refusal(self.user, method, path)
                if response is None:
                    response = self.shared.front.route(method, path, query, self.headers,
                                                       b"".join(self.body))
                self.send_python(response, keep, method)
        except Exception:
            # A bug, not the client's fault: it gets a 500, the log the trace.
            self.out.len = mark
            self.core.log.exception("HTTP %s %r failed", method.decode("latin-1"), url[:200])
            self.send_python(self.shared.front.problem(500, "internal server error",
                                                       "the server failed; see its log"),
                             keep, method)

    cdef void run_endpoint(self, int endpoint, bytes query, bint keep):
        """One of the check endpoints, timed as a command is."""
        cdef Command stats = self.shared.fast_stats[endpoint]
        cdef size_t mark = self.out.len
        cdef int64_t t0 = fl_mono_ns()
        try:
            if endpoint == EP_CHECK_BATCH:
                self.batch(keep)
            else:
                self.one_check(endpoint, bool(query) and self.shared.front.enforced(query),
                               keep)
        except BadField as e:
            stats.failed_calls += 1
            self.out.len = mark
            self.send_python(self.shared.front.bad_field(e), keep, b"POST")
        except Refused as e:
            stats.failed_calls += 1
            self.out.len = mark
            self.send_python(self.shared.front.refused(e.error), keep, b"POST")
        record_call(stats, fl_mono_ns() - t0)

    cdef bint authorized(self, bytes path):
        """Whether the request may go on, and as which ACL user (self.user):
        the one its Authorization header names, else the default user.
        With no password on the default user, a request needs none (a
        header that fails is ignored, as before users existed)."""
        cdef HttpShared shared = self.shared
        cdef ServerCore core = self.core
        acl = core.app.acl
        header = self.authorization
        self.user = core.default_user
        may_pass = not core.auth_required or path in OPEN_PATHS or \
            (path == b"/metrics" and not shared.metrics_auth)
        if header is None:
            return may_pass
        cached = self.authorized_for
        if header == self.authorized_header and cached is not None and cached[0] == acl.version:
            self.user = cached[1]
            return True
        pair = credentials(header)
        # A Basic user name that is no ACL user is the default user, as
        # before users existed (any name went with requirepass).
        user = acl.authenticate(pair[0] if pair[0] in acl.users else "default", pair[1]) \
            if pair is not None else None
        if user is None:
            if not may_pass:
                core.app.auth_failures += 1
            return may_pass
        self.authorized_header, self.authorized_for = header, (acl.version, user)
        self.user = user
        return True

    cdef void permit(self, bytes name, int position, bytes key):
        """Refuses (403, NOPERM, in ACL LOG) a check of key as command name
        (the key at position) that the request's ACL user may not make,
        as the RESP connection refuses it (_protocol's acl_verdict)."""
        cdef Arg argv[3]
        cdef Command cmd
        cdef int i, pos
        grant = self.user.grant if self.user is not None else None
        if grant is None:
            return
        cmd = self.core.commands[name]
        argv[0].ptr, argv[0].len = PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)
        for i in range(1, 3):
            argv[i].ptr, argv[i].len = PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)
        pos = acl_verdict(grant[0], grant[1], cmd, argv, position + 1)
        if pos == 0:
            return
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        self.core.app.acl.log_denial(None, "command" if pos < 0 else "key",
                                     cmd.name if pos < 0 else key.decode("utf-8",
                                                                         "surrogateescape"),
                                     False, username=self.user.name,
                                     client_info=f"addr={peer_text(peer)} front=http")
        if pos < 0:
            raise Refused(f"NOPERM this user has no permissions to run the '{cmd.name}' command")
        raise Refused("NOPERM this user has no permissions to access one of the keys used as "
                      "arguments")

    cdef dict json_body(self):
        doc = parse_json(self.body[0] if len(self.body) == 1 else b"".join(self.body))
        if type(doc) is not dict:
            raise BadField(None, "the body must be a JSON object")
        return doc

    # ---- the check endpoints ---------------------------------------------------------

    cdef void one_check(self, int endpoint, bint enforce, bint keep):
        cdef CheckResult r
        cdef uint32_t binding
        doc = self.json_body()
        try:
            binding = self.decide(endpoint, doc, &r)
        except Forwarded as f:
            self.queue_task(forwarded_response(self, f.answer, f.binding, enforce, keep))
            return
        self.write_decision_response(&r, binding, enforce, keep)

    cdef bytes decision_bytes(self, list reply, uint32_t binding, bint enforce, bint keep):
        """A decision's response as bytes, apart from this connection's
        output (a forwarded check's, sent in its turn)."""
        cdef CheckResult r
        cdef size_t mark = self.out.len
        r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms = reply[:5]
        self.write_decision_response(&r, binding, enforce, keep)
        data = PyBytes_FromStringAndSize(self.out.buf + mark, self.out.len - mark)
        self.out.len = mark
        return data

    cdef uint32_t decide(self, int endpoint, dict doc, CheckResult* r):
        """One check's decision into r; returns the binding rule's number
        (0: none, or a bucket)."""
        if endpoint == EP_CHECK:
            return self.limit(doc, r)
        if endpoint == EP_LIMITS_CHECK:
            return self.apply(doc, r)
        self.bucket(doc, r)
        return 0

    cdef uint32_t limit(self, dict doc, CheckResult* r):
        """CL.LIMIT <client_key> <resource> [TIER t] [COST n]."""
        cdef int n = 0
        cdef bytes client = utf8(text_field(doc, "client_key", True))
        cdef bytes resource = utf8(text_field(doc, "resource", True))
        tier_text = text_field(doc, "tier", False)
        cdef bytes tier = utf8(tier_text) if tier_text is not None else None
        cdef int64_t cost = integer_field(doc, "cost", 1, 0, MAX_COST)
        cdef int asked = self.asked_priority(doc)
        self.permit(b"cl.limit", 1, client)
        self.route(client)
        error = check_limit(self.core, PyBytes_AS_STRING(client), PyBytes_GET_SIZE(client),
                            PyBytes_AS_STRING(resource), PyBytes_GET_SIZE(resource),
                            PyBytes_AS_STRING(tier) if tier is not None else NULL,
                            PyBytes_GET_SIZE(tier) if tier is not None else 0,
                            cost, asked, self.user_priority(), self.core.clock.now_ms(), r, &n)
        if error is HOME_ELSEWHERE:
            args = [b"CL.LIMIT", client, resource, b"COST", b"%d" % cost]
            if tier is not None:
                args += [b"TIER", tier]
            if asked != FL_PRIO_UNSET:
                args += [b"PRIORITY", PRIORITIES[asked].encode()]
            return self.elsewhere(args, client, resource, cost, r, lambda: self.core.rules.limit(
                client, resource, tier, cost))
        if error is not None:
            raise Refused(error)
        return self.core.rules.binding_rule

    cdef uint32_t elsewhere(self, list args, bytes client, bytes resource, int64_t cost,
                            CheckResult* r, check) except? 0:
        """A check whose key lives in another region, run again in Python
        (check()) to be answered as regions/subsystem.py answer_elsewhere
        says: at once (the home is unreachable), or raising Forwarded
        with the wait for the home's reply."""
        registry = self.core.app.rules
        try:
            five = check()
        except HomeElsewhere as e:
            answer = self.core.app.regions_sync.answer_elsewhere(e, args, client, resource,
                                                                 cost, False)
            if type(answer) is not list:
                raise Forwarded(answer, next(
                    (num for num in e.rules if registry.rule_for_num(num) is not None
                     and registry.rule_for_num(num).regions == "home"), 0))
            five = answer
        r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms = five
        return self.core.rules.binding_rule if r.remaining != FL_SHED_REMAINING else 0

    cdef uint32_t apply(self, dict doc, CheckResult* r):
        """CL.APPLY <id>[,<id>...] <key> [RESOURCE r] [COST n]."""
        ids = doc.get("rule_id")
        if type(ids) is str:
            ids = [ids]
        if type(ids) is not list or not ids or any(type(i) is not str for i in ids):
            raise BadField("rule_id", "rule_id must be a rule id or a non-empty list of them")
        cdef bytes key = utf8(text_field(doc, "key", True))
        resource = text_field(doc, "resource", False)
        cdef int64_t cost = integer_field(doc, "cost", 1, 0, MAX_COST)
        registry = self.core.app.rules
        nums = []
        for rule_id in ids:
            num = registry.num_for(rule_id)
            if num is None:
                raise BadField("rule_id", f"no such rule '{rule_id}'", 404)
            nums.append(num)
        cdef int asked = self.asked_priority(doc)
        self.permit(b"cl.apply", 2, key)
        self.route(key)
        if self.core.readonly and cost != 0:
            raise Refused("READONLY You can't write against a read only replica.")
        cdef bytes resource_bytes = utf8(resource) if resource else b""
        try:
            shed = self.core.shed_rules(nums, asked, self.user_priority())
            if shed is not None:
                r.allowed, r.limit, r.remaining, r.retry_after_ms, r.reset_after_ms = shed
                return 0
            args = [b"CL.APPLY", ",".join(ids).encode(), key, b"RESOURCE", resource_bytes,
                    b"COST", b"%d" % cost]
            if asked != FL_PRIO_UNSET:
                args += [b"PRIORITY", PRIORITIES[asked].encode()]
            return self.elsewhere(args, key, resource_bytes, cost, r,
                                  lambda: self.core.rules.apply(nums, key, cost, resource_bytes))
        except ValueError as e:
            raise Refused(f"ERR {e}") from None
        except MemoryError:
            raise Refused("OOM out of memory: the bucket could not be stored") from None

    cdef void bucket(self, dict doc, CheckResult* r):
        """CL.CHECK <key> <capacity> <refill_per_sec> [COST n] [PERIOD ms]."""
        cdef BucketParams bp
        cdef bytes key = utf8(text_field(doc, "key", True))
        bp.capacity = integer_field(doc, "capacity", 0, 1, MAX_COST)
        bp.refill = integer_field(doc, "refill_per_sec", 0, 1, MAX_COST)
        bp.period_ms = integer_field(doc, "period_ms", 1000, 1, MAX_COST)
        bp.cost = integer_field(doc, "cost", 1, 0, MAX_COST)
        cdef int split = integer_field(doc, "split", 1, 1, FL_SPLIT_MAX)
        cdef int priority = self.asked_priority(doc)
        if "capacity" not in doc:
            raise BadField("capacity", "capacity is required")
        if "refill_per_sec" not in doc:
            raise BadField("refill_per_sec", "refill_per_sec is required")
        self.permit(b"cl.check", 1, key)
        self.route(key)
        error = check_bucket(self.core, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &bp,
                             split, self.user_priority() if priority == FL_PRIO_UNSET
                             else priority, self.core.clock.now_ms(), r)
        if error is not None:
            raise Refused(error)

    cdef int asked_priority(self, dict doc) except -2:
        """The body's "priority" (low, normal or critical), at most its
        user's; FL_PRIO_UNSET when it names none."""
        value = doc.get("priority")
        if value is None:
            return FL_PRIO_UNSET
        asked = priority_value(value) if type(value) is str else None
        if asked is None:
            raise BadField("priority", "priority must be low, normal or critical")
        cap = self.user.priority if self.user is not None else None
        return asked if cap is None or asked <= cap else cap

    cdef int user_priority(self) except -2:
        """Its user's priority (acl/rules.py's User.priority), else normal."""
        cap = self.user.priority if self.user is not None else None
        return FL_PRIO_NORMAL if cap is None else cap

    cdef void route(self, bytes key):
        error = self.core.route_key(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
        if error is not None:
            raise Refused(error)

    cdef void batch(self, bint keep):
        """{"checks": [...]}: each a /v1/check or (with rule_id) a
        /v1/limits/check document, answered in order, each with its own
        decision or error; one bad check fails only itself."""
        cdef CheckResult r
        cdef uint32_t binding
        cdef Writer* w = &BODY
        doc = self.json_body()
        checks = doc.get("checks")
        if type(checks) is not list:
            raise BadField("checks", "checks must be a list of check documents")
        if len(checks) > self.shared.batch_max:
            raise BadField("checks", f"at most {self.shared.batch_max} checks in one batch",
                           413)
        writer_reset(w)
        write_raw(w, b'{"results":[', 12)
        for i, check in enumerate(checks):
            if i:
                write_raw(w, b",", 1)
            try:
                if type(check) is not dict:
                    raise BadField(None, "a check must be a JSON object")
                binding = self.decide(EP_LIMITS_CHECK if "rule_id" in check else EP_CHECK,
                                      check, &r)
                self.write_decision(&r, binding)
            except BadField as e:
                write_bytes(w, self.shared.front.batch_error(e.status, e.detail, e.field))
            except Forwarded as f:     # a batch is answered at once, whole
                f.answer.close()
                write_bytes(w, self.shared.front.batch_error(421, self.home_refusal(), None))
            except Refused as e:
                write_bytes(w, self.shared.front.batch_error(
                    ERROR_STATUS.get(e.error.partition(" ")[0], 500), e.error, None))
        write_raw(w, b"]}", 2)
        self.begin_response(200, b"application/json", keep)
        self.finish_response()

    # ---- responses ---------------------------------------------------------------------

    cdef void write_decision_response(self, const CheckResult* r, uint32_t binding,
                                      bint enforce, bint keep):
        cdef bint denied = not r.allowed
        cdef tuple info = self.shared.describe_rule(binding) if binding else None
        writer_reset(&BODY)
        self.write_decision(r, binding, info)
        self.begin_response(429 if denied and enforce else 200, b"application/json", keep)
        if info is not None:
            self.write_ratelimit_headers(r, info, denied and enforce)
        if r.remaining == FL_SHED_REMAINING:     # not counted: the node sheds load
            write_raw(&self.out, b"X-FastLimit-Shed: 1\r\n", 21)
            if denied and enforce:
                write_raw(&self.out, b"Retry-After: 1\r\n", 16)
        self.finish_response()

    cdef void write_ratelimit_headers(self, const CheckResult* r, tuple info, bint retry_after):
        cdef Writer* w = &self.out
        cdef bytes name = info[0]
        cdef bytes policy = info[1]
        cdef int64_t token_ms = info[2]
        cdef int64_t t
        if policy is not None:
            write_raw(w, b"RateLimit-Policy: ", 18)
            write_bytes(w, policy)
            write_raw(w, b"\r\n", 2)
        write_raw(w, b"RateLimit: ", 11)
        write_bytes(w, name)
        write_raw(w, b";r=", 3)
        write_decimal(w, r.remaining if r.remaining > 0 else 0)
        if not r.allowed:
            t = r.retry_after_ms
        elif r.remaining >= r.limit:
            t = 0
        else:
            t = r.reset_after_ms if r.reset_after_ms < token_ms else token_ms
        if t >= 0:
            write_raw(w, b";t=", 3)
            write_decimal(w, ceil_seconds(t))
        write_raw(w, b"\r\n", 2)
        if retry_after and r.retry_after_ms >= 0:
            write_raw(w, b"Retry-After: ", 13)
            write_decimal(w, ceil_seconds(r.retry_after_ms) or 1)
            write_raw(w, b"\r\n", 2)

    cdef void write_decision(self, const CheckResult* r, uint32_t binding, tuple info=None):
        cdef Writer* w = &BODY
        if binding and info is None:
            info = self.shared.describe_rule(binding)
        if r.allowed:
            write_raw(w, b'{"allowed":true,"limit":', 24)
        else:
            write_raw(w, b'{"allowed":false,"limit":', 25)
        write_decimal(w, r.limit)
        write_raw(w, b',"remaining":', 13)
        write_decimal(w, r.remaining)
        write_raw(w, b',"retry_after_ms":', 18)
        write_decimal(w, r.retry_after_ms)
        write_raw(w, b',"reset_after_ms":', 18)
        write_decimal(w, r.reset_after_ms)
        if r.remaining == FL_SHED_REMAINING:
            write_raw(w, b',"shed":true', 12)
        if info is None:
            write_raw(w, b',"rule":null}', 13)
            return
        write_raw(w, b',"rule":', 8)
        write_bytes(w, info[3])
        write_raw(w, b"}", 1)

    cdef void begin_response(self, int status, bytes content_type, bint keep):
        """The status line and the fixed headers; the caller may add more,
        then finish_response sends the length and the body."""
        cdef Writer* w = &self.out
        write_bytes(w, STATUS_LINES.get(status) or status_line(status))
        write_bytes(w, self.shared.date)
        write_raw(w, b"Content-Type: ", 14)
        write_bytes(w, content_type)
        write_raw(w, b"\r\n", 2)
        if not keep:
            write_raw(w, b"Connection: close\r\n", 19)

    cdef void finish_response(self):
        """Content-Length, the blank line, and the body made in BODY."""
        cdef Writer* w = &self.out
        write_raw(w, b"Content-Length: ", 16)
        write_decimal(w, BODY.len)
        write_raw(w, b"\r\n\r\n", 4)
        write_raw(w, BODY.buf, BODY.len)

    cdef str home_refusal(self):
        """A batch's check whose key lives in another region."""
        name = self.core.app.regions.names[self.core.rules.home_region]
        return (f"HOME {name}: the check's key lives in region {name}, which answers it; "
                "a batch does not wait on another region: send this check alone")

    cdef void send_python(self, response, bint keep, bytes method):
        """A Python handler's Response, or an awaitable of one: sent in
        request order (what follows it waits)."""
        if type(response) is self.shared.response_type:
            self.emit(self.shared.front.encode(response, keep, method == b"HEAD"))
            return
        self.queue_task(self.shared.front.finish(response, keep, method == b"HEAD"))

    cdef void queue_task(self, coroutine):
        """A response that waits (a coroutine of its bytes): sent in request
        order, and what follows it waits behind it."""
        task = asyncio.ensure_future(coroutine)
        if self.pending is None:
            self.pending = []
            self.update_reading()
        self.pending.append(task)
        task.add_done_callback(self.task_done)

    cdef object waiting_task(self):
        """The last handler task still waiting for its response, if any."""
        if self.pending is None:
            return None
        for item in reversed(self.pending):
            if not isinstance(item, bytes):
                return item
        return None

    cdef void emit(self, bytes data):
        if self.pending is not None:
            self.pending.append(data)
        else:
            write_bytes(&self.out, data)

    def task_done(self, task):
        if self.closed:
            return
        self.flush()

    cdef void fail(self, int status, str title, str detail):
        """Answers a request that cannot be read on, and closes."""
        self.fail_with(self.shared.front.problem(status, title, detail))

    cdef void fail_with(self, response):
        self.closing = True
        self.emit(self.shared.front.encode(response, False, False))

    cdef void write_out(self):
        """Sends the responses made in out."""
        cdef bytes data
        if self.out.len and self.transport is not None:
            data = PyBytes_FromStringAndSize(self.out.buf, self.out.len)
            writer_reset(&self.out)
            self.transport.write(data)

    cdef void flush(self):
        """Sends what is ready, in request order, then goes on with what
        waited for it."""
        if self.transport is None:
            writer_reset(&self.out)
            return
        self.write_out()
        if self.pending is not None:
            while self.pending:
                item = self.pending[0]
                if isinstance(item, bytes):
                    self.transport.write(item)
                elif item.done():
                    self.transport.write(item.result() if not item.cancelled() else b"")
                else:
                    return
                self.pending.pop(0)
            self.pending = None
        if self.closing:
            self.transport.close()
            return
        if self.over_output_limit():
            return
        self.go_on()

    cdef bint over_output_limit(self):
        """Drops a client whose unsent output is past the normal class's
        client-output-buffer-limit hard limit, as RESP drops one."""
        cdef int64_t hard = self.core.output_hard_limit
        cdef int64_t unsent
        if hard <= 0 or self.transport is None:
            return False
        unsent = self.transport.get_write_buffer_size()
        if unsent <= hard:
            return False
        self.core.log.warning("closing an HTTP client: output buffer %d bytes over the hard "
                              "limit", unsent)
        self.abort()
        return True


def status_line(int status):
    return f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode("ascii")


STATUS_LINES = {status: status_line(status) for status in REASONS}
