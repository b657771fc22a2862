"""Redis Cluster hash slots in C.  See _cluster.pxd for the contract."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint16_t
from libc.string cimport memchr

# CRC16-XMODEM (poly 0x1021, init 0, no reflection, no final xor), one
# table lookup per byte as Redis's crc16.c; filled once at import.
cdef uint16_t _CRC16_TABLE[256]


cdef void _fill_crc16_table() noexcept nogil:
    cdef uint16_t crc
    cdef int i, bit
    for i in range(256):
        crc = <uint16_t>(i << 8)
        for bit in range(8):
            if crc & 0x8000:
                crc = <uint16_t>((crc << 1) ^ 0x1021)
            else:
                crc = <uint16_t>(crc << 1)
        _CRC16_TABLE[i] = crc


_fill_crc16_table()


cdef inline uint16_t _crc16(const unsigned char* buf, size_t n) noexcept nogil:
    cdef uint16_t crc = 0
    cdef size_t i
    for i in range(n):
        crc = <uint16_t>((crc << 8) ^ _CRC16_TABLE[((crc >> 8) ^ buf[i]) & 0xFF])
    return crc


cdef int key_slot(const char* key, size_t n) noexcept nogil:
    # Redis's hash tag: the bytes between the first '{' and the first '}'
    # after it, if there is at least one; otherwise the whole key.
    cdef const char* open_ = <const char*>memchr(key, b'{', n)
    cdef const char* close
    cdef size_t after
    if open_ != NULL:
        after = n - <size_t>(open_ - key) - 1
        close = <const char*>memchr(open_ + 1, b'}', after)
        if close != NULL and close != open_ + 1:
            return _crc16(<const unsigned char*>(open_ + 1),
                          <size_t>(close - open_ - 1)) & 0x3FFF
    return _crc16(<const unsigned char*>key, n) & 0x3FFF


def keyslot(bytes key not None):
    """The hash slot of key (CLUSTER KEYSLOT), 0..16383."""
    return key_slot(PyBytes_AS_STRING(key), <size_t>PyBytes_GET_SIZE(key))


SLOTS = CLUSTER_SLOTS
