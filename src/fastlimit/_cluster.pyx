"""Redis Cluster hash slots in C.  See _cluster.pxd for the contract."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint16_t
from libc.string cimport memchr

# CRC16-XMODEM (poly 0x1021, init 0, no reflection, no final xor), as
# Redis's crc16.c computes it, but eight bytes per step ("slicing by 8"):
# _TABLES[k][x] is the CRC of byte x followed by k zero bytes, so by the
# CRC's linearity the CRC after eight bytes is the xor of one lookup per
# byte, the running CRC mixing into the first two.  Routing computes this
# for every keyed command in cluster mode; it is half the instructions
# of one lookup per byte.  Filled once at import.
cdef uint16_t _TABLES[8][256]


cdef void _fill_crc16_tables() noexcept nogil:
    cdef uint16_t crc, prev
    cdef int i, bit, k
    for i in range(256):
        crc = <uint16_t>(i << 8)
        for bit in range(8):
            if crc & 0x8000:
                crc = <uint16_t>((crc << 1) ^ 0x1021)
            else:
                crc = <uint16_t>(crc << 1)
        _TABLES[0][i] = crc
    for k in range(1, 8):
        for i in range(256):
            prev = _TABLES[k - 1][i]
            _TABLES[k][i] = <uint16_t>(((prev & 0xFF) << 8) ^ _TABLES[0][prev >> 8])


_fill_crc16_tables()


cdef inline uint16_t _crc16(const unsigned char* buf, size_t n) noexcept nogil:
    cdef uint16_t crc = 0
    while n >= 8:
        crc = (_TABLES[7][(crc >> 8) ^ buf[0]] ^ _TABLES[6][(crc & 0xFF) ^ buf[1]]
               ^ _TABLES[5][buf[2]] ^ _TABLES[4][buf[3]] ^ _TABLES[3][buf[4]]
               ^ _TABLES[2][buf[5]] ^ _TABLES[1][buf[6]] ^ _TABLES[0][buf[7]])
        buf += 8
        n -= 8
    while n:
        crc = <uint16_t>((crc << 8) ^ _TABLES[0][((crc >> 8) ^ buf[0]) & 0xFF])
        buf += 1
        n -= 1
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
