# Redis Cluster hash slots: CRC16-XMODEM of the key (or of its {hash tag})
# mod 16384, as Redis's keyHashSlot (cluster.c).  No Python objects, no
# errors: every byte string has a slot, so _protocol.pyx can route in C.

cdef enum:
    CLUSTER_SLOTS = 16384

# The slot of key[0:n], 0..16383.
cdef int key_slot(const char* key, size_t n) noexcept nogil
