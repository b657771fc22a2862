"""RESP parsing and reply encoding.  See _resp.pxd for the contract.

Error texts follow Redis's networking.c so that clients and operators
see what they already know.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t, uintptr_t, INT64_MAX
from libc.limits cimport INT_MAX
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memchr
from libc.stdio cimport snprintf

import time


class SimpleString(str):
    """A reply sent as a RESP simple string (+OK)."""


class Verbatim(str):
    """Text sent as a RESP3 verbatim string, or a bulk string on RESP2."""


# A handler returns this when the command sends no reply (SHUTDOWN).
NO_REPLY = object()


class Sliced:
    """A reply that takes long to compute, made in slices so that other
    clients are served in between (Redis would block everyone instead).

    A handler returns ``Sliced(steps)``, where steps is a generator: each
    ``next()`` does a bounded piece of work, and its return value is the
    reply (or it raises ReplyError).  The connection runs slices for a time
    budget per event-loop turn and holds its own later commands until the
    reply is sent; inside EXEC it runs them all at once."""

    __slots__ = ("steps", "reply")

    def __init__(self, steps):
        self.steps = steps
        self.reply = None

    def advance(self, double budget_s):
        """Runs slices for about budget_s; True once the reply is made."""
        cdef double deadline = time.perf_counter() + budget_s
        try:
            while True:
                next(self.steps)
                if time.perf_counter() >= deadline:
                    return False
        except StopIteration as done:
            self.reply = done.value
            return True

    def finish(self):
        """Runs every slice left; the reply."""
        self.advance(float("inf"))
        return self.reply


class ReplyError(Exception):
    """Raised by a command handler; sent to the client as -<message>.
    The message starts with the error code, e.g. "ERR syntax error"."""


# ---- parser -----------------------------------------------------------------

cdef enum:
    ARGV_INITIAL = 16
    ARGV_KEEP = 1024    # larger argv arrays are released after use
    HEADER_READ = 1     # parse_bulk_header read a "$<len>" line


cdef inline void parser_restart(Parser* p) noexcept:
    # The next call starts a new command at the first byte it is given.
    p.multibulk = 0
    p.bulk_len = -1
    p.pos = 0
    p.scanned = 0


cdef int parser_init(Parser* p) noexcept:
    p.argv = <Arg*>malloc(ARGV_INITIAL * sizeof(Arg))
    p.argv_cap = ARGV_INITIAL if p.argv != NULL else 0
    p.argc = 0
    p.scratch = NULL
    p.scratch_cap = 0
    p.need = 0
    p.error = NULL
    parser_restart(p)
    return 0 if p.argv != NULL else -1


cdef void parser_free(Parser* p) noexcept:
    free(p.argv)
    free(p.scratch)
    p.argv = NULL
    p.scratch = NULL
    p.argv_cap = 0
    p.scratch_cap = 0


cdef int parser_reserve(Parser* p, int argc) noexcept:
    cdef size_t cap = <size_t>p.argv_cap
    cdef Arg* bigger
    if argc <= p.argv_cap:
        return 0
    while cap < <size_t>argc:
        cap *= 2
    if cap > <size_t>INT_MAX:
        cap = <size_t>argc
    bigger = <Arg*>realloc(p.argv, cap * sizeof(Arg))
    if bigger == NULL:
        return -1
    p.argv = bigger
    p.argv_cap = <int>cap
    return 0


cdef void parser_release(Parser* p) noexcept:
    """Gives back what one huge command grew, once nothing needs it: no
    command is half parsed and the last one has run."""
    cdef Arg* small
    if p.multibulk != 0:
        return
    if p.argv_cap > ARGV_KEEP:
        small = <Arg*>realloc(p.argv, ARGV_INITIAL * sizeof(Arg))
        if small != NULL:
            p.argv = small
            p.argv_cap = ARGV_INITIAL
    if p.scratch_cap > INLINE_MAX:
        free(p.scratch)
        p.scratch = NULL
        p.scratch_cap = 0


cdef size_t parser_memory(const Parser* p) noexcept:
    return <size_t>p.argv_cap * sizeof(Arg) + p.scratch_cap


cdef bint parse_int64(const char* s, size_t n, int64_t* out) noexcept nogil:
    """Redis's string2ll: optional '-', digits, no leading zeros, no
    spaces or '+', and no overflow."""
    cdef size_t i = 0
    cdef bint negative = False
    cdef uint64_t v = 0, d
    if n == 0 or n > 20:
        return False
    if n == 1 and s[0] == c'0':
        out[0] = 0
        return True
    if s[0] == c'-':
        negative = True
        i = 1
        if n == 1:
            return False
    if s[i] < c'1' or s[i] > c'9':
        return False
    while i < n:
        if s[i] < c'0' or s[i] > c'9':
            return False
        d = <uint64_t>(s[i] - c'0')
        if v > (<uint64_t>INT64_MAX + 1 - d) // 10:
            return False
        v = v * 10 + d
        i += 1
    if negative:
        if v > <uint64_t>INT64_MAX + 1:
            return False
        out[0] = <int64_t>(0 - v)
    else:
        if v > <uint64_t>INT64_MAX:
            return False
        out[0] = <int64_t>v
    return True


cdef inline int fail(Parser* p, const char* msg) noexcept:
    p.error = msg
    parser_restart(p)
    return PARSE_ERROR


cdef inline int incomplete(Parser* p, size_t need) noexcept:
    p.need = need
    return PARSE_INCOMPLETE


cdef inline const char* find_line_end(Parser* p, const char* buf, size_t length,
                                      char terminator) noexcept:
    """The terminator of the line being read, searched only in bytes no
    earlier call has searched; NULL (remembering how far it looked) when
    it has not arrived.  A CR must be followed by one more byte."""
    cdef size_t from_ = p.scanned
    cdef const char* end
    if from_ < p.pos:
        from_ = p.pos
    end = <const char*>memchr(buf + from_, terminator, length - from_)
    if end == NULL:
        p.scanned = length
        return NULL
    if terminator == c'\r' and <size_t>(end - buf) + 1 >= length:
        p.scanned = end - buf    # look at this CR again with its next byte
        return NULL
    return end


cdef int parse_command(Parser* p, const char* buf, size_t length,
                       size_t* consumed, const ParseLimits* lim) noexcept:
    """Parses one command at the start of buf, resuming an incomplete one
    where the previous call stopped.  On PARSE_COMMAND and PARSE_EMPTY,
    *consumed is how many bytes it used."""
    p.need = 0
    if p.multibulk == 0:
        p.argc = 0
    if length == 0:
        return incomplete(p, 1)
    if buf[0] == c'*':
        return parse_multibulk(p, buf, length, consumed, lim)
    return parse_inline(p, buf, length, consumed)


cdef int parse_multibulk(Parser* p, const char* buf, size_t length,
                         size_t* consumed, const ParseLimits* lim) noexcept:
    cdef const char* cr
    cdef int64_t count
    cdef int i, rc
    if p.multibulk == 0:
        cr = find_line_end(p, buf, length, c'\r')
        if cr == NULL:
            if length > INLINE_MAX:
                return fail(p, b"ERR Protocol error: too big mbulk count string")
            return incomplete(p, length + 1)
        if cr[1] != c'\n' or not parse_int64(buf + 1, cr - buf - 1, &count) \
                or count > lim.max_multibulk_len:
            return fail(p, b"ERR Protocol error: invalid multibulk length")
        if count > UNAUTH_MAX_MULTIBULK and lim.unauthenticated:
            return fail(p, b"ERR Protocol error: unauthenticated multibulk length")
        if count <= 0:
            consumed[0] = cr - buf + 2
            parser_restart(p)
            return PARSE_EMPTY
        p.multibulk = count
        p.pos = cr - buf + 2
    while p.argc < p.multibulk:
        if p.bulk_len < 0:
            rc = parse_bulk_header(p, buf, length, lim)
            if rc != HEADER_READ:
                return rc
        if p.pos + <size_t>p.bulk_len + 2 > length:
            return incomplete(p, p.pos + <size_t>p.bulk_len + 2)
        if buf[p.pos + p.bulk_len] != c'\r' or buf[p.pos + p.bulk_len + 1] != c'\n':
            return fail(p, b"ERR Protocol error: expected CRLF after bulk data")
        if parser_reserve(p, p.argc + 1) != 0:
            return fail(p, b"ERR Protocol error: out of memory")
        p.argv[p.argc].ptr = <const char*><uintptr_t>p.pos    # an offset, see Parser
        p.argv[p.argc].len = <size_t>p.bulk_len
        p.argc += 1
        p.pos += <size_t>p.bulk_len + 2
        p.bulk_len = -1
    for i in range(p.argc):
        p.argv[i].ptr = buf + <uintptr_t>p.argv[i].ptr
    consumed[0] = p.pos
    parser_restart(p)
    return PARSE_COMMAND


cdef int parse_bulk_header(Parser* p, const char* buf, size_t length,
                           const ParseLimits* lim) noexcept:
    """Reads the "$<len>" line at p.pos into p.bulk_len: HEADER_READ,
    or PARSE_ERROR or PARSE_INCOMPLETE."""
    cdef const char* cr
    cdef size_t pos = p.pos
    cdef int64_t blen
    if pos >= length:
        return incomplete(p, pos + 1)
    if buf[pos] != c'$':
        snprintf(p.error_buf, sizeof(p.error_buf),
                 b"ERR Protocol error: expected '$', got '%c'", buf[pos])
        return fail(p, p.error_buf)
    cr = find_line_end(p, buf, length, c'\r')
    if cr == NULL:
        if length - pos > INLINE_MAX:
            return fail(p, b"ERR Protocol error: too big bulk count string")
        return incomplete(p, length + 1)
    if cr[1] != c'\n' or not parse_int64(buf + pos + 1, cr - buf - pos - 1, &blen) \
            or blen < 0 or blen > lim.max_bulk_len:
        return fail(p, b"ERR Protocol error: invalid bulk length")
    if blen > UNAUTH_MAX_BULK and lim.unauthenticated:
        return fail(p, b"ERR Protocol error: unauthenticated bulk length")
    p.bulk_len = blen
    p.pos = cr - buf + 2
    return HEADER_READ


cdef inline bint is_space(char c) noexcept:
    return c == c' ' or c == c'\t' or c == c'\n' or c == c'\r' \
        or c == c'\v' or c == c'\f'


cdef inline int hex_value(char c) noexcept:
    if c'0' <= c <= c'9':
        return c - c'0'
    if c'a' <= c <= c'f':
        return c - c'a' + 10
    if c'A' <= c <= c'F':
        return c - c'A' + 10
    return -1


cdef int parse_inline(Parser* p, const char* buf, size_t length,
                      size_t* consumed) noexcept:
    """A plain text command line, split as Redis's sdssplitargs does
    (double quotes with escapes, single quotes)."""
    cdef const char* nl = find_line_end(p, buf, length, c'\n')
    cdef size_t n, i = 0
    cdef char* out
    cdef char c, quote
    cdef int argc = 0
    if nl == NULL:
        if length > INLINE_MAX:
            return fail(p, b"ERR Protocol error: too big inline request")
        return incomplete(p, length + 1)
    parser_restart(p)
    n = nl - buf
    consumed[0] = n + 1
    if n > 0 and buf[n - 1] == c'\r':
        n -= 1
    if p.scratch_cap < n + 1:
        free(p.scratch)
        p.scratch = <char*>malloc(n + 1)
        p.scratch_cap = n + 1 if p.scratch != NULL else 0
        if p.scratch == NULL:
            return fail(p, b"ERR Protocol error: out of memory")
    out = p.scratch
    while True:
        while i < n and is_space(buf[i]):
            i += 1
        if i >= n:
            break
        if parser_reserve(p, argc + 1) != 0:
            return fail(p, b"ERR Protocol error: out of memory")
        p.argv[argc].ptr = out
        quote = 0
        while True:
            if quote == c'"':
                if i >= n:
                    return fail(p, b"ERR Protocol error: unbalanced quotes in request")
                c = buf[i]
                if c == c'\\' and i + 3 < n and buf[i + 1] == c'x' \
                        and hex_value(buf[i + 2]) >= 0 and hex_value(buf[i + 3]) >= 0:
                    out[0] = <char>(hex_value(buf[i + 2]) * 16 + hex_value(buf[i + 3]))
                    out += 1
                    i += 4
                    continue
                if c == c'\\' and i + 1 < n:
                    i += 1
                    c = buf[i]
                    if c == c'n':
                        c = c'\n'
                    elif c == c'r':
                        c = c'\r'
                    elif c == c't':
                        c = c'\t'
                    elif c == c'b':
                        c = c'\b'
                    elif c == c'a':
                        c = c'\a'
                elif c == c'"':
                    i += 1
                    if i < n and not is_space(buf[i]):
                        return fail(p, b"ERR Protocol error: unbalanced quotes in request")
                    break
                out[0] = c
                out += 1
                i += 1
            elif quote == c"'":
                if i >= n:
                    return fail(p, b"ERR Protocol error: unbalanced quotes in request")
                c = buf[i]
                if c == c'\\' and i + 1 < n and buf[i + 1] == c"'":
                    i += 1
                elif c == c"'":
                    i += 1
                    if i < n and not is_space(buf[i]):
                        return fail(p, b"ERR Protocol error: unbalanced quotes in request")
                    break
                out[0] = buf[i]
                out += 1
                i += 1
            else:
                if i >= n:
                    break
                c = buf[i]
                if c == c' ' or c == c'\n' or c == c'\r' or c == c'\t':
                    break
                if c == c'"' or c == c"'":
                    quote = c
                else:
                    out[0] = c
                    out += 1
                i += 1
        p.argv[argc].len = out - p.argv[argc].ptr
        argc += 1
    p.argc = argc
    return PARSE_COMMAND if argc > 0 else PARSE_EMPTY


# ---- writer -----------------------------------------------------------------

cdef int writer_init(Writer* w, size_t cap) noexcept:
    w.buf = <char*>malloc(cap)
    w.len = 0
    w.cap = cap if w.buf != NULL else 0
    return 0 if w.buf != NULL else -1


cdef void writer_free(Writer* w) noexcept:
    free(w.buf)
    w.buf = NULL
    w.len = 0
    w.cap = 0


cdef int writer_grow(Writer* w, size_t extra) noexcept:
    cdef size_t cap = w.cap * 2
    cdef char* bigger
    if cap < w.len + extra:
        cap = w.len + extra
    bigger = <char*>realloc(w.buf, cap)
    if bigger == NULL:
        return -1
    w.buf = bigger
    w.cap = cap
    return 0


cdef enum:
    WRITER_KEEP = 1 << 20


cdef void writer_reset(Writer* w) noexcept:
    # Keep a modest buffer between reads; give back what a burst grew.
    cdef char* small
    w.len = 0
    if w.cap > WRITER_KEEP:
        small = <char*>realloc(w.buf, 16384)
        if small != NULL:
            w.buf = small
            w.cap = 16384


cdef int write_raw(Writer* w, const char* s, size_t n) noexcept:
    if writer_reserve(w, n) != 0:
        return -1
    memcpy(w.buf + w.len, s, n)
    w.len += n
    return 0


cdef int write_prefixed_int(Writer* w, char prefix, int64_t v) noexcept:
    """Writes <prefix><decimal>\\r\\n, e.g. ":42\\r\\n" or "*5\\r\\n"."""
    cdef char* out
    if writer_reserve(w, 24) != 0:
        return -1
    out = w.buf + w.len
    out[0] = prefix
    out = put_decimal(out + 1, v)
    out[0] = c'\r'
    out[1] = c'\n'
    w.len = out + 2 - w.buf
    return 0


cdef int write_bulk(Writer* w, const char* s, size_t n) noexcept:
    if write_prefixed_int(w, c'$', <int64_t>n) != 0 or writer_reserve(w, n + 2) != 0:
        return -1
    memcpy(w.buf + w.len, s, n)
    w.buf[w.len + n] = c'\r'
    w.buf[w.len + n + 1] = c'\n'
    w.len += n + 2
    return 0


cdef int write_line(Writer* w, char prefix, const char* s, size_t n) noexcept:
    """+status or -error: CR and LF inside would break framing, so they
    become spaces, as Redis does."""
    cdef size_t i
    cdef char* out
    if writer_reserve(w, n + 3) != 0:
        return -1
    out = w.buf + w.len
    out[0] = prefix
    for i in range(n):
        out[i + 1] = c' ' if s[i] == c'\r' or s[i] == c'\n' else s[i]
    out[n + 1] = c'\r'
    out[n + 2] = c'\n'
    w.len += n + 3
    return 0


cdef int write_null(Writer* w, int proto) noexcept:
    if proto >= 3:
        return write_raw(w, b"_\r\n", 3)
    return write_raw(w, b"$-1\r\n", 5)


cdef int write_map_header(Writer* w, int64_t pairs, int proto) noexcept:
    if proto >= 3:
        return write_prefixed_int(w, c'%', pairs)
    return write_prefixed_int(w, c'*', pairs * 2)


cdef int encode_str(Writer* w, object s, char prefix) except -1:
    cdef bytes b = s.encode("utf-8", "surrogateescape")
    cdef int rc
    if prefix == c'$':
        rc = write_bulk(w, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
    else:
        rc = write_line(w, prefix, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
    if rc != 0:
        raise MemoryError()
    return 0


cdef int encode_reply(Writer* w, object value, int proto) except -1:
    """Encodes a handler's Python reply.  bytes and str are bulk strings;
    SimpleString, ReplyError, Verbatim, None, bool, int, float, list,
    tuple, dict and set map to their RESP2 or RESP3 forms."""
    cdef int rc = 0
    cdef bytes b
    if value is NO_REPLY:
        return 0
    if value is None:
        rc = write_null(w, proto)
    elif value is True or value is False:
        if proto >= 3:
            rc = write_raw(w, b"#t\r\n" if value else b"#f\r\n", 4)
        else:
            rc = write_raw(w, b":1\r\n" if value else b":0\r\n", 4)
    elif isinstance(value, int):
        rc = write_prefixed_int(w, c':', value)
    elif isinstance(value, bytes):
        rc = write_bulk(w, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
    elif isinstance(value, SimpleString):
        encode_str(w, value, c'+')
    elif isinstance(value, Verbatim):
        if proto >= 3:
            b = ("txt:" + value).encode("utf-8", "surrogateescape")
            rc = write_prefixed_int(w, c'=', PyBytes_GET_SIZE(b))
            rc = rc or write_raw(w, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
            rc = rc or write_raw(w, b"\r\n", 2)
        else:
            encode_str(w, value, c'$')
    elif isinstance(value, str):
        encode_str(w, value, c'$')
    elif isinstance(value, ReplyError):
        encode_str(w, str(value), c'-')
    elif isinstance(value, (list, tuple)):
        rc = write_prefixed_int(w, c'*', len(value))
        for item in value:
            encode_reply(w, item, proto)
    elif isinstance(value, dict):
        rc = write_map_header(w, len(value), proto)
        for k, v in value.items():
            encode_reply(w, k, proto)
            encode_reply(w, v, proto)
    elif isinstance(value, (set, frozenset)):
        rc = write_prefixed_int(w, c'~' if proto >= 3 else c'*', len(value))
        for item in value:
            encode_reply(w, item, proto)
    elif isinstance(value, float):
        if proto >= 3:
            encode_str(w, repr(value), c',')
        else:
            encode_str(w, repr(value), c'$')
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as a reply")
    if rc != 0:
        raise MemoryError()
    return 0


cdef ParseLimits make_limits(int64_t max_bulk_len, int64_t max_multibulk_len,
                             bint unauthenticated):
    cdef ParseLimits lim
    lim.max_bulk_len = max_bulk_len
    lim.max_multibulk_len = max_multibulk_len
    lim.unauthenticated = unauthenticated
    return lim


cdef int parse_all(Parser* p, const char* buf, size_t n, const ParseLimits* lim,
                   list commands, size_t* used_out) except -2:
    """Parses every complete command in buf[0:n] into commands; *used_out
    is the bytes they used.  Returns the last parse status."""
    cdef size_t pos = 0, used = 0
    cdef int status = PARSE_INCOMPLETE, i
    while pos < n:
        status = parse_command(p, buf + pos, n - pos, &used, lim)
        if status == PARSE_INCOMPLETE or status == PARSE_ERROR:
            break
        if status == PARSE_COMMAND:
            commands.append([p.argv[i].ptr[:p.argv[i].len] for i in range(p.argc)])
        pos += used
    used_out[0] = pos
    return status


def parse(bytes data, *, int64_t max_bulk_len=512 * 1024 * 1024,
          int64_t max_multibulk_len=1024 * 1024, bint unauthenticated=False):
    """Parses every complete command in data, as a connection would.
    Returns (commands, consumed, error): the argument lists parsed, the
    bytes they used, and the protocol error text that stopped parsing
    (or None when the rest is simply incomplete)."""
    cdef Parser p
    cdef ParseLimits lim = make_limits(max_bulk_len, max_multibulk_len, unauthenticated)
    cdef size_t used = 0
    cdef int status
    cdef list commands = []
    if parser_init(&p) != 0:
        raise MemoryError()
    try:
        status = parse_all(&p, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &lim,
                           commands, &used)
        if status == PARSE_ERROR:
            return commands, used, p.error.decode("latin-1")
        return commands, used, None
    finally:
        parser_free(&p)


def parse_stream(chunks, *, int64_t max_bulk_len=512 * 1024 * 1024,
                 int64_t max_multibulk_len=1024 * 1024, bint unauthenticated=False):
    """Feeds chunks to one parser, one read each, as a connection does:
    what was not used stays for the next read, in a new buffer each time
    (a connection's buffer moves too), and a read that cannot complete
    the next argument is not parsed.  Stops at the first error.  Returns
    (commands, error, rest, calls): error is None or the error text, rest
    the bytes left unparsed, calls how many reads were parsed."""
    cdef Parser p
    cdef ParseLimits lim = make_limits(max_bulk_len, max_multibulk_len, unauthenticated)
    cdef size_t used = 0
    cdef int status
    cdef list commands = []
    cdef bytes buf = b""
    cdef int64_t calls = 0
    if parser_init(&p) != 0:
        raise MemoryError()
    try:
        for chunk in chunks:
            buf = buf + chunk
            if <size_t>PyBytes_GET_SIZE(buf) < p.need:
                continue
            calls += 1
            status = parse_all(&p, PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf), &lim,
                               commands, &used)
            if status == PARSE_ERROR:
                return commands, p.error.decode("latin-1"), buf, calls
            buf = buf[used:]
        return commands, None, buf, calls
    finally:
        parser_free(&p)


def parse_integer(data):
    """The integer in data (bytes or str) by Redis's string2ll rules, the
    same parser the fast paths use: optional '-', ASCII digits, no '+',
    spaces, underscores or leading zeros, within int64.  None otherwise."""
    cdef int64_t v
    cdef bytes raw
    if isinstance(data, str):
        try:
            raw = (<str>data).encode("ascii")
        except UnicodeEncodeError:
            return None
    elif isinstance(data, bytes):
        raw = <bytes>data
    else:
        return None
    if not parse_int64(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), &v):
        return None
    return v
