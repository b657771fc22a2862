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


cdef inline bytes reader_bytes(const Reader* r):
    return PyBytes_FromStringAndSize(<const char*>r.p, r.end - r.p)


cdef object decode_entry(Reader* r):
    """RateLimitDescriptor.Entry {1 key, 2 value}: (key, value), or None
    if malformed."""
    cdef uint32_t f, wt
    cdef Reader sub
    cdef bytes key = b""
    cdef bytes value = b""
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return None
        if (f == 1 or f == 2) and wt == WT_LEN:
            if get_len(r, &sub) != 0:
                return None
            if f == 1:
                key = reader_bytes(&sub)
            else:
                value = reader_bytes(&sub)
        elif skip_field(r, wt) != 0:
            return None
    return (key, value)


# decode_request's too_many
cdef enum:
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


cdef object decode_descriptor(Reader* r, int* too_many):
    """RateLimitDescriptor {1 entries, 2 limit, 3 hits_addend}: the
    interface's (entries, limit or None, hits_addend or None), or None if
    malformed or (too_many set) past MAX_DESCRIPTOR_ENTRIES."""
    cdef uint32_t f, wt
    cdef Reader sub
    cdef list entries = []
    cdef bint has_limit = False, has_hits = False
    cdef uint32_t rpu = 0
    cdef int32_t unit = 0
    cdef uint64_t hits = 0
    while r.p < r.end:
        if next_field(r, &f, &wt) != 0:
            return None
        if 1 <= f <= 3 and wt == WT_LEN:
            if get_len(r, &sub) != 0:
                return None
            if f == 1:
                if len(entries) == MAX_DESCRIPTOR_ENTRIES:
                    too_many[0] = TOO_MANY_ENTRIES
                    return None
                entry = decode_entry(&sub)
                if entry is None:
                    return None
                entries.append(entry)
            elif f == 2:
                has_limit = True
                if decode_override(&sub, &rpu, &unit) != 0:
                    return None
            else:
                has_hits = True
                if decode_uint64_value(&sub, &hits) != 0:
                    return None
        elif skip_field(r, wt) != 0:
            return None
    return (entries, (rpu, unit) if has_limit else None, hits if has_hits else None)


cdef object decode_request(const uint8_t* data, size_t n, uint32_t max_descriptors,
                           int* too_many):
    """RateLimitRequest {1 domain, 2 descriptors, 3 hits_addend}: the
    arguments of should_rate_limit, or None if malformed or (too_many set)
    past max_descriptors or MAX_DESCRIPTOR_ENTRIES, found before the rest
    is decoded."""
    cdef Reader r, sub
    cdef uint32_t f, wt
    cdef uint64_t v
    cdef bytes domain = b""
    cdef list descriptors = []
    cdef uint32_t hits = 0
    r.p = data
    r.end = data + n
    while r.p < r.end:
        if next_field(&r, &f, &wt) != 0:
            return None
        if (f == 1 or f == 2) and wt == WT_LEN:
            if get_len(&r, &sub) != 0:
                return None
            if f == 1:
                domain = reader_bytes(&sub)
            else:
                if <uint32_t>len(descriptors) >= max_descriptors:
                    too_many[0] = TOO_MANY_DESCRIPTORS
                    return None
                descriptor = decode_descriptor(&sub, too_many)
                if descriptor is None:
                    return None
                descriptors.append(descriptor)
        elif f == 3 and wt == WT_VARINT:
            if get_varint(&r, &v) != 0:
                return None
            hits = <uint32_t>v
        elif skip_field(&r, wt) != 0:
            return None
    return (domain, descriptors, hits)


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


cdef int encode_status(Writer* w, object status) except -1:
    """RateLimitResponse.DescriptorStatus {1 code, 2 current_limit
    {1 requests_per_unit, 2 unit, 3 name}, 3 limit_remaining,
    4 duration_until_reset {1 seconds}} from the interface's
    (code, (requests_per_unit, unit, name) or None, remaining, seconds)."""
    code, current, remaining, reset = status
    cdef Py_ssize_t start = begin_message(w, 2)
    cdef Py_ssize_t inner
    cdef uint32_t c = code
    cdef uint32_t rem = remaining
    cdef int64_t seconds = reset
    cdef uint32_t rpu, unit
    cdef bytes name
    if put_uint_field(w, 1, c) != 0:
        raise MemoryError()
    if current is not None:
        rpu, unit, name = current
        inner = begin_message(w, 2)
        if (put_uint_field(w, 1, rpu) != 0 or put_uint_field(w, 2, unit) != 0
                or put_bytes_field(w, 3, name) != 0 or end_message(w, inner) != 0):
            raise MemoryError()
    if put_uint_field(w, 3, rem) != 0:
        raise MemoryError()
    if current is not None or seconds:
        # Envoy's x-ratelimit-reset reads it only when present
        inner = begin_message(w, 4)
        if put_uint_field(w, 1, <uint64_t>seconds) != 0 or end_message(w, inner) != 0:
            raise MemoryError()
    if end_message(w, start) != 0:
        raise MemoryError()
    return 0


cdef int encode_response(Writer* w, overall, list statuses, list headers) except -1:
    """RateLimitResponse {1 overall_code, 2 statuses, 3
    response_headers_to_add (HeaderValue {1 key, 2 value})}."""
    cdef uint32_t code = overall
    cdef Py_ssize_t start
    cdef bytes key, value
    if put_uint_field(w, 1, code) != 0:
        raise MemoryError()
    for status in statuses:
        encode_status(w, status)
    for key, value in headers:
        start = begin_message(w, 3)
        if (put_bytes_field(w, 1, key) != 0 or put_bytes_field(w, 2, value) != 0
                or end_message(w, start) != 0):
            raise MemoryError()
    return 0
