# Included by _grpc.pyx: the protobuf wire format, read and written by hand
# in C, and the codecs of the messages the front speaks: Envoy's
# RateLimitRequest in and RateLimitResponse out
# (envoy.service.ratelimit.v3), grpc.health.v1's HealthCheckRequest.

# Only what the two RLS messages and the health check use: varints and
# length-delimited fields; fixed32/64 are skipped like any unknown field
# (so a newer Envoy's additions pass); groups, which proto3 never sends,
# are malformed.  Every length is checked against what is left.

cdef enum:
    WT_VARINT = 0
    WT_FIXED64 = 1
    WT_LEN = 2
    WT_FIXED32 = 5


cdef struct Reader:
    const uint8_t* p
    const uint8_t* end


cdef int get_varint(Reader* r, uint64_t* out) noexcept:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t b
    while r.p < r.end and shift < 64:
        b = r.p[0]
        r.p += 1
        v |= <uint64_t>(b & 0x7f) << shift
        if b < 0x80:
            out[0] = v
            return 0
        shift += 7
    return -1


cdef int next_field(Reader* r, uint32_t* field, uint32_t* wire_type) noexcept:
    cdef uint64_t tag
    if get_varint(r, &tag) != 0 or tag >> 3 == 0 or tag >> 3 > 0x1fffffff:
        return -1
    field[0] = <uint32_t>(tag >> 3)
    wire_type[0] = <uint32_t>(tag & 7)
    return 0


cdef int get_len(Reader* r, Reader* sub) noexcept:
    cdef uint64_t n
    if get_varint(r, &n) != 0 or n > <uint64_t>(r.end - r.p):
        return -1
    sub.p = r.p
    sub.end = r.p + n
    r.p += n
    return 0


cdef int skip_field(Reader* r, uint32_t wire_type) noexcept:
    cdef uint64_t v
    cdef Reader sub
    if wire_type == WT_VARINT:
        return get_varint(r, &v)
    if wire_type == WT_LEN:
        return get_len(r, &sub)
    if wire_type == WT_FIXED64 or wire_type == WT_FIXED32:
        v = 8 if wire_type == WT_FIXED64 else 4
        if v > <uint64_t>(r.end - r.p):
            return -1
        r.p += v
        return 0
    return -1


cdef inline void reader_slice(const Reader* r, Slice* out) noexcept:
    out.p = <const char*>r.p
    out.n = <size_t>(r.end - r.p)


cdef int decode_entry(Reader* r, RlsEntry* e) noexcept:
    """RateLimitDescriptor.Entry {1 key, 2 value} into e (each empty when
    absent); -1 if malformed."""
    cdef uint32_t f, wt
    cdef Reader sub
    e.key.p = e.value.p = ""
    e.key.n = e.value.n = 0
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return -1
        if (f == 1 or f == 2) and wt == WT_LEN:
            if get_len(r, &sub) != 0:
                return -1
            reader_slice(&sub, &e.key if f == 1 else &e.value)
        elif skip_field(r, wt) != 0:
            return -1
    return 0


# decode_request's answers besides 0
cdef enum:
    MALFORMED = -1
    NO_MEMORY = -2
    TOO_MANY_DESCRIPTORS = 1
    TOO_MANY_ENTRIES = 2


cdef int decode_override(Reader* r, uint32_t* rpu, int32_t* unit) noexcept:
    """RateLimitOverride {1 requests_per_unit, 2 unit}, merged into what
    an earlier occurrence set (protobuf's rule for a repeated singular
    message)."""
    cdef uint32_t f, wt
    cdef uint64_t v
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return -1
        if (f == 1 or f == 2) and wt == WT_VARINT:
            if get_varint(r, &v) != 0:
                return -1
            if f == 1:
                rpu[0] = <uint32_t>v
            else:
                unit[0] = <int32_t><uint32_t>v
        elif skip_field(r, wt) != 0:
            return -1
    return 0


cdef int decode_uint64_value(Reader* r, uint64_t* value) noexcept:
    """google.protobuf.UInt64Value {1 value}."""
    cdef uint32_t f, wt
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return -1
        if f == 1 and wt == WT_VARINT:
            if get_varint(r, value) != 0:
                return -1
        elif skip_field(r, wt) != 0:
            return -1
    return 0


# The decoded request's descriptors and entries (slices of the message),
# grown as needed and reused by every call: one call is decided at a time.
cdef RlsDescriptor* DESCRIPTORS = NULL
cdef size_t DESCRIPTORS_CAP = 0
cdef RlsEntry* ENTRIES = NULL
cdef size_t ENTRIES_CAP = 0


cdef int decode_descriptor(Reader* r, RlsDescriptor* d, uint32_t first_entry) noexcept:
    """RateLimitDescriptor {1 entries, 2 limit, 3 hits_addend} into d, its
    entries into ENTRIES from first_entry (d.entries is set once the whole
    request is read: ENTRIES may move meanwhile); 0, MALFORMED, NO_MEMORY
    or TOO_MANY_ENTRIES past MAX_DESCRIPTOR_ENTRIES."""
    cdef uint32_t f, wt
    cdef Reader sub
    memset(d, 0, sizeof(RlsDescriptor))
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return MALFORMED
        if 1 <= f <= 3 and wt == WT_LEN:
            if get_len(r, &sub) != 0:
                return MALFORMED
            if f == 1:
                if d.nentries == MAX_DESCRIPTOR_ENTRIES:
                    return TOO_MANY_ENTRIES
                if fl_room(<void**>&ENTRIES, &ENTRIES_CAP, first_entry + d.nentries + 1,
                           sizeof(RlsEntry), 16) != 0:
                    return NO_MEMORY
                if decode_entry(&sub, &ENTRIES[first_entry + d.nentries]) != 0:
                    return MALFORMED
                d.nentries += 1
            elif f == 2:
                d.has_override = True
                if decode_override(&sub, &d.override_rpu, &d.override_unit) != 0:
                    return MALFORMED
            else:
                d.has_hits = True
                if decode_uint64_value(&sub, &d.hits) != 0:
                    return MALFORMED
        elif skip_field(r, wt) != 0:
            return MALFORMED
    return 0


cdef int decode_request(const uint8_t* data, size_t n, uint32_t max_descriptors,
                        RlsRequest* req) noexcept:
    """RateLimitRequest {1 domain, 2 descriptors, 3 hits_addend} into req,
    as slices of data: 0, MALFORMED, NO_MEMORY, or TOO_MANY_DESCRIPTORS /
    TOO_MANY_ENTRIES past max_descriptors or MAX_DESCRIPTOR_ENTRIES, found
    before the rest is decoded."""
    cdef Reader r, sub
    cdef uint32_t f, wt, i, entries = 0
    cdef uint64_t v
    cdef int rc
    r.p = data
    r.end = data + n
    req.domain.p = ""
    req.domain.n = 0
    req.ndescriptors = 0
    req.hits_addend = 0
    while r.p < r.end:
        if next_field(&r, &f, &wt) != 0:
            return MALFORMED
        if (f == 1 or f == 2) and wt == WT_LEN:
            if get_len(&r, &sub) != 0:
                return MALFORMED
            if f == 1:
                reader_slice(&sub, &req.domain)
            else:
                if req.ndescriptors >= max_descriptors:
                    return TOO_MANY_DESCRIPTORS
                if fl_room(<void**>&DESCRIPTORS, &DESCRIPTORS_CAP, req.ndescriptors + 1,
                           sizeof(RlsDescriptor), 16) != 0:
                    return NO_MEMORY
                rc = decode_descriptor(&sub, &DESCRIPTORS[req.ndescriptors], entries)
                if rc != 0:
                    return rc
                entries += DESCRIPTORS[req.ndescriptors].nentries
                req.ndescriptors += 1
        elif f == 3 and wt == WT_VARINT:
            if get_varint(&r, &v) != 0:
                return MALFORMED
            req.hits_addend = <uint32_t>v
        elif skip_field(&r, wt) != 0:
            return MALFORMED
    req.descriptors = DESCRIPTORS
    entries = 0
    for i in range(req.ndescriptors):
        DESCRIPTORS[i].entries = ENTRIES + entries
        entries += DESCRIPTORS[i].nentries
    return 0


cdef int decode_health_request(const uint8_t* data, size_t n, Reader* service) noexcept:
    """HealthCheckRequest {1 service}: the service name's bytes."""
    cdef Reader r
    cdef uint32_t f, wt
    r.p = data
    r.end = data + n
    service.p = service.end = data
    while r.p < r.end:
        if next_field(&r, &f, &wt) != 0:
            return -1
        if f == 1 and wt == WT_LEN:
            if get_len(&r, service) != 0:
                return -1
        elif skip_field(&r, wt) != 0:
            return -1
    return 0


cdef inline int put_varint(Writer* w, uint64_t v) noexcept:
    cdef uint8_t* p
    if writer_reserve(w, 10) != 0:
        return -1
    p = <uint8_t*>w.buf + w.len
    while v >= 0x80:
        p[0] = <uint8_t>(v | 0x80)
        p += 1
        v >>= 7
    p[0] = <uint8_t>v
    w.len = <size_t>(p + 1 - <uint8_t*>w.buf)
    return 0


cdef inline int put_uint_field(Writer* w, uint32_t field, uint64_t v) noexcept:
    """A varint field, left out when 0 (proto3's default)."""
    if v == 0:
        return 0
    if put_varint(w, field << 3 | WT_VARINT) != 0:
        return -1
    return put_varint(w, v)


cdef int put_bytes_field(Writer* w, uint32_t field, bytes value) noexcept:
    cdef size_t n = PyBytes_GET_SIZE(value)
    if n == 0:
        return 0
    if put_varint(w, field << 3 | WT_LEN) != 0 or put_varint(w, n) != 0:
        return -1
    return write_raw(w, PyBytes_AS_STRING(value), n)


cdef inline Py_ssize_t begin_message(Writer* w, uint32_t field) noexcept:
    """Starts an embedded message: its tag and one byte for its length
    (end_message widens it when the message is 128 bytes or more)."""
    if put_varint(w, field << 3 | WT_LEN) != 0 or writer_reserve(w, 1) != 0:
        return -1
    w.len += 1
    return <Py_ssize_t>w.len


cdef int end_message(Writer* w, Py_ssize_t start) noexcept:
    cdef size_t n = w.len - <size_t>start
    cdef size_t width = 1
    cdef size_t v = n
    cdef uint8_t* p
    if start < 0:
        return -1
    while v >= 0x80:
        width += 1
        v >>= 7
    if width > 1:
        if writer_reserve(w, width - 1) != 0:
            return -1
        memmove(w.buf + start + width - 1, w.buf + start, n)
        w.len += width - 1
    p = <uint8_t*>w.buf + start - 1
    v = n
    while v >= 0x80:
        p[0] = <uint8_t>(v | 0x80)
        p += 1
        v >>= 7
    p[0] = <uint8_t>v
    return 0


cdef int put_slice_field(Writer* w, uint32_t field, Slice value) noexcept:
    if value.n == 0:
        return 0
    if put_varint(w, field << 3 | WT_LEN) != 0 or put_varint(w, value.n) != 0:
        return -1
    return write_raw(w, value.p, value.n)


cdef int encode_status(Writer* w, const RlsStatus* s) noexcept:
    """RateLimitResponse.DescriptorStatus {1 code, 2 current_limit
    {1 requests_per_unit, 2 unit, 3 name}, 3 limit_remaining,
    4 duration_until_reset {1 seconds}}."""
    cdef Py_ssize_t start = begin_message(w, 2)
    cdef Py_ssize_t inner
    if put_uint_field(w, 1, <uint32_t>s.code) != 0:
        return -1
    if s.has_limit:
        inner = begin_message(w, 2)
        if (put_uint_field(w, 1, s.rpu) != 0 or put_uint_field(w, 2, s.unit) != 0
                or put_slice_field(w, 3, s.name) != 0 or end_message(w, inner) != 0):
            return -1
    if put_uint_field(w, 3, <uint32_t>s.remaining) != 0:
        return -1
    if s.has_limit or s.reset_s:
        # Envoy's x-ratelimit-reset reads it only when present
        inner = begin_message(w, 4)
        if put_uint_field(w, 1, <uint64_t>s.reset_s) != 0 or end_message(w, inner) != 0:
            return -1
    return end_message(w, start)


cdef int encode_response(Writer* w, const RlsOutcome* out, list headers) except -1:
    """RateLimitResponse {1 overall_code, 2 statuses, 3
    response_headers_to_add (HeaderValue {1 key, 2 value})}."""
    cdef Py_ssize_t start
    cdef bytes key, value
    cdef uint32_t i
    if put_uint_field(w, 1, <uint32_t>out.overall) != 0:
        raise MemoryError()
    for i in range(out.n):
        if encode_status(w, &out.statuses[i]) != 0:
            raise MemoryError()
    for key, value in headers:
        start = begin_message(w, 3)
        if (put_bytes_field(w, 1, key) != 0 or put_bytes_field(w, 2, value) != 0
                or end_message(w, start) != 0):
            raise MemoryError()
    return 0


cdef int encode_decision(Writer* w, overall, list statuses, list headers) except -1:
    """encode_response of a decision as Python objects (another region's):
    (code, (requests_per_unit, unit, name) or None, remaining, seconds) per
    status."""
    cdef RlsOutcome out
    cdef uint32_t i
    cdef bytes name
    out.overall = overall
    out.n = len(statuses)
    out.statuses = <RlsStatus*>calloc(out.n + 1, sizeof(RlsStatus))
    if out.statuses == NULL:
        raise MemoryError()
    try:
        for i, (code, current, remaining, reset) in enumerate(statuses):
            out.statuses[i].code = code
            out.statuses[i].remaining = remaining
            out.statuses[i].reset_s = reset
            if current is not None:
                out.statuses[i].has_limit = True
                out.statuses[i].rpu, out.statuses[i].unit, name = current
                out.statuses[i].name.p = PyBytes_AS_STRING(name)
                out.statuses[i].name.n = PyBytes_GET_SIZE(name)
        encode_response(w, &out, headers)
    finally:
        free(out.statuses)
    return 0
