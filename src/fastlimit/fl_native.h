/* Small C helpers for the Cython core: keyed hashing, page-backed
 * allocations that really return memory to the OS, clocks, and
 * unaligned field access for packed records.
 *
 * Every function here is total: failures are reported through the
 * return value (NULL / -1), never through errno games or Python.
 */
#ifndef FL_NATIVE_H
#define FL_NATIVE_H

#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>

/* ---- SipHash-1-3 (keyed, so clients cannot craft colliding keys) ---- */

#define FL_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define FL_SIPROUND                                                        \
    do {                                                                   \
        v0 += v1; v1 = FL_ROTL(v1, 13); v1 ^= v0; v0 = FL_ROTL(v0, 32);   \
        v2 += v3; v3 = FL_ROTL(v3, 16); v3 ^= v2;                          \
        v0 += v3; v3 = FL_ROTL(v3, 21); v3 ^= v0;                          \
        v2 += v1; v1 = FL_ROTL(v1, 17); v1 ^= v2; v2 = FL_ROTL(v2, 32);   \
    } while (0)

static inline uint64_t fl_load64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t fl_siphash13(const void *data, size_t len,
                                    const uint8_t *key16) {
    const uint8_t *in = (const uint8_t *)data;
    uint64_t k0 = fl_load64(key16), k1 = fl_load64(key16 + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0;
    uint64_t v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0;
    uint64_t v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = ((uint64_t)len) << 56;
    const uint8_t *end = in + len - (len % 8);
    for (; in != end; in += 8) {
        uint64_t m = fl_load64(in);
        v3 ^= m;
        FL_SIPROUND;
        v0 ^= m;
    }
    switch (len & 7) {
    case 7: b |= ((uint64_t)in[6]) << 48; /* fall through */
    case 6: b |= ((uint64_t)in[5]) << 40; /* fall through */
    case 5: b |= ((uint64_t)in[4]) << 32; /* fall through */
    case 4: b |= ((uint64_t)in[3]) << 24; /* fall through */
    case 3: b |= ((uint64_t)in[2]) << 16; /* fall through */
    case 2: b |= ((uint64_t)in[1]) << 8;  /* fall through */
    case 1: b |= ((uint64_t)in[0]);       /* fall through */
    case 0: break;
    }
    v3 ^= b;
    FL_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    FL_SIPROUND; FL_SIPROUND; FL_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- Page-backed allocations ----
 * Tables and arenas are allocated straight from the kernel so that
 * freeing or shrinking them gives the memory back (glibc's dynamic mmap
 * threshold would otherwise move large blocks onto the heap, where
 * freed memory is not returned).  Untouched pages cost no RSS, so
 * growing an arena geometrically wastes address space, not memory. */

#define FL_PAGE ((size_t)4096)

static inline size_t fl_page_round(size_t n) {
    return (n + FL_PAGE - 1) & ~(FL_PAGE - 1);
}

/* Zero-filled block of at least `size` bytes, or NULL. */
static inline void *fl_big_alloc(size_t size) {
    void *p = mmap(NULL, fl_page_round(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Grows or shrinks a block from fl_big_alloc, keeping its contents;
 * new bytes are zero.  NULL on failure (the old block stays valid). */
static inline void *fl_big_realloc(void *p, size_t old_size, size_t new_size) {
    void *q = mremap(p, fl_page_round(old_size), fl_page_round(new_size),
                     MREMAP_MAYMOVE);
    return q == MAP_FAILED ? NULL : q;
}

static inline void fl_big_free(void *p, size_t size) {
    if (p != NULL)
        munmap(p, fl_page_round(size));
}

/* Blocks below this size come from malloc (cheap, and keeps the number of
 * kernel mappings low); larger ones from the kernel directly. */
#define FL_MMAP_MIN ((size_t)16384)

static inline void *fl_mem_alloc(size_t size) {
    return size < FL_MMAP_MIN ? calloc(1, size) : fl_big_alloc(size);
}

static inline void fl_mem_free(void *p, size_t size) {
    if (size < FL_MMAP_MIN)
        free(p);
    else
        fl_big_free(p, size);
}

/* Resizes a block from fl_mem_alloc; bytes past old_size are zero.
 * NULL on failure, and the old block stays valid. */
static inline void *fl_mem_realloc(void *p, size_t old_size, size_t new_size) {
    if (old_size >= FL_MMAP_MIN && new_size >= FL_MMAP_MIN)
        return fl_big_realloc(p, old_size, new_size);
    void *q = fl_mem_alloc(new_size);
    if (q == NULL)
        return NULL;
    memcpy(q, p, old_size < new_size ? old_size : new_size);
    fl_mem_free(p, old_size);
    return q;
}

/* ---- Clocks ---- */

static inline int64_t fl_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t fl_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- Unaligned access to packed record fields ---- */

/* A hint: start loading the cache line at p (replicas apply batches of
   records whose slots and records are all cache misses). */
static inline void fl_prefetch(const void *p) { __builtin_prefetch(p); }

static inline int64_t fl_get_i64(const char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline void fl_put_i64(char *p, int64_t v) { memcpy(p, &v, 8); }
static inline uint32_t fl_get_u32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void fl_put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline uint16_t fl_get_u16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void fl_put_u16(char *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- Checked 128-bit arithmetic helpers for the bucket maths ---- */

typedef __int128 fl_i128;

/* ---- CRC-32 (zlib's: reflected 0xEDB88320), so that a snapshot's
 * checksum can be chained between C and Python's zlib.crc32 ---- */

static inline uint32_t fl_crc32(uint32_t crc, const void *data, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    const uint8_t *p = (const uint8_t *)data;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    crc = ~crc;
    while (n--)
        crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ---- Input bounds for the token bucket (see _core.pxd) ---- */

#define MAX_CAPACITY ((int64_t)1000000000000000LL)
#define MAX_REFILL ((int64_t)1000000000000000LL)
#define MAX_PERIOD_MS ((int64_t)4294967295LL)
#define MAX_REFILL_TIME_MS ((int64_t)1000000000000000LL)
/* GCRA (named rules, CL.THROTTLE): ticks are 1/count ms, so now * count and
 * period_ms * (burst + 1) must stay far inside int64. */
#define MAX_GCRA_COUNT ((int64_t)1000000LL)
#define MAX_GCRA_BURST ((int64_t)1000000000LL)
#define MAX_GCRA_TOLERANCE ((int64_t)1000000000000000000LL)

/* Below 2^32 - 1 seconds, so expiry seconds fit a u32 (see expire_second). */
#define MAX_NOW_MS ((int64_t)4000000000000LL)

#endif /* FL_NATIVE_H */
