# RESP2/RESP3 wire format: an incremental command parser that points into
# the caller's buffer, and a growable reply writer.  No asyncio, no
# Python objects on the hot path; C functions report failure by value.

from libc.stdint cimport int64_t, uint64_t

cdef enum:
    # Redis's PROTO_INLINE_MAX_SIZE: the longest inline command, and the
    # longest "*<count>" or "$<len>" line we wait for.
    INLINE_MAX = 65536
    # Redis's limits for clients that still have to authenticate.
    UNAUTH_MAX_MULTIBULK = 10
    UNAUTH_MAX_BULK = 16384

cdef enum ParseStatus:
    PARSE_ERROR = -1        # protocol error: reply parser.error, then close
    PARSE_INCOMPLETE = 0    # need more bytes (at least parser.need in all)
    PARSE_COMMAND = 1       # argv/argc hold one command
    PARSE_EMPTY = 2         # consumed bytes that hold no command

cdef struct Arg:
    const char* ptr
    size_t len

cdef struct ParseLimits:
    int64_t max_bulk_len
    int64_t max_multibulk_len
    bint unauthenticated

cdef struct Parser:
    Arg* argv
    int argc
    int argv_cap
    char* scratch          # decoded inline arguments live here
    size_t scratch_cap
    size_t need            # bytes the buffer must hold before re-parsing helps
    const char* error      # message for PARSE_ERROR (without "-" and CRLF)
    char error_buf[64]
    # Where an incomplete command stopped, so that the next call resumes
    # there (Redis's multibulklen/bulklen): each read costs O(new bytes).
    # Offsets count from the command's first byte, because the caller's
    # buffer may move between calls; until the command is complete,
    # argv[i].ptr holds such an offset, not a pointer.
    int64_t multibulk      # declared argument count; 0 until the '*' line is read
    int64_t bulk_len       # length of the bulk whose '$' line is read, or -1
    size_t pos             # where the next '$' line or the bulk data starts
    size_t scanned         # the current line holds no terminator before this

cdef int parser_init(Parser* p) noexcept
cdef void parser_free(Parser* p) noexcept
cdef int parser_reserve(Parser* p, int argc) noexcept
cdef void parser_release(Parser* p) noexcept
cdef size_t parser_memory(const Parser* p) noexcept

# buf must start where the previous call's command started (or at a new
# command after PARSE_COMMAND, PARSE_EMPTY or PARSE_ERROR), holding at
# least the bytes that call saw.
cdef int parse_command(Parser* p, const char* buf, size_t length,
                       size_t* consumed, const ParseLimits* lim) noexcept
cdef bint parse_int64(const char* s, size_t n, int64_t* out) noexcept nogil


cdef struct Writer:
    char* buf
    size_t len
    size_t cap

cdef int writer_init(Writer* w, size_t cap) noexcept
cdef void writer_free(Writer* w) noexcept
cdef int writer_grow(Writer* w, size_t extra) noexcept
cdef void writer_reset(Writer* w) noexcept

cdef inline int writer_reserve(Writer* w, size_t n) noexcept:
    if w.len + n <= w.cap:
        return 0
    return writer_grow(w, n)

cdef inline char* put_decimal(char* out, int64_t v) noexcept:
    """Writes v in decimal at out (room for 20 bytes); returns its end."""
    cdef char tmp[24]
    cdef int n = 0
    cdef uint64_t u
    if v < 0:
        out[0] = c'-'
        out += 1
        u = <uint64_t>0 - <uint64_t>v
    else:
        u = <uint64_t>v
    while True:
        tmp[n] = <char>(c'0' + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    while n > 0:
        n -= 1
        out[0] = tmp[n]
        out += 1
    return out

cdef inline int write_decimal(Writer* w, int64_t v) noexcept:
    if writer_reserve(w, 24) != 0:
        return -1
    w.len = put_decimal(w.buf + w.len, v) - w.buf
    return 0

cdef int write_raw(Writer* w, const char* s, size_t n) noexcept
cdef int write_prefixed_int(Writer* w, char prefix, int64_t v) noexcept
cdef int write_bulk(Writer* w, const char* s, size_t n) noexcept
cdef int write_line(Writer* w, char prefix, const char* s, size_t n) noexcept
cdef int write_null(Writer* w, int proto) noexcept
cdef int write_map_header(Writer* w, int64_t pairs, int proto) noexcept
cdef int encode_reply(Writer* w, object value, int proto) except -1
