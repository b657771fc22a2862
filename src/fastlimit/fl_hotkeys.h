/* The hot-key tracker: a bounded estimate of the keys checked most often
 * (Space-Saving, Metwally, Agrawal and El Abbadi 2005) over a sample of the
 * checks.  Plain C, no Python: every function is total and reports failure
 * through its return value.  _hotkeys.pyx wraps it; the check path
 * (check_bucket in _protocol_checks.pxi, RuleEngine.evaluate in _rules.pyx)
 * calls fl_hk_due and, on a sampled check only,
 * fl_hk_offer.
 *
 * Space-Saving keeps k counters.  A key already counted adds one to its
 * counter; a new key takes over the smallest counter, whose count c it
 * inherits plus one, with c recorded as its error.  For every key counted,
 * count - error <= true hits <= count, and every key with more than
 * (hits sampled)/k hits is counted.  Counters are kept as Space-Saving's
 * stream-summary: a list of buckets of equal count in increasing order,
 * each a list of its counters, so an increment moves a counter to the next
 * bucket and the counter to take over is any of the first bucket's, both
 * O(1); an open-addressing index by the key's hash finds a key's counter,
 * so a sample costs O(1), not O(k).
 *
 * Sampling: one check in `sample` on average.  A countdown is decremented
 * on every check (fl_hk_due: one decrement and one branch); when it reaches
 * zero the check is offered and the countdown re-armed with an interval
 * drawn uniformly from 1 .. 2*sample-1 (mean `sample`), so a client that
 * cycles through a fixed set of keys is not seen as one key.
 *
 * Time: in continuous mode (half_life_ms > 0) counts and the time they
 * cover are halved every half_life_ms, so a rate is count / covered time
 * over the recent past; in a session (half_life_ms == 0) nothing decays and
 * the covered time is the session's length.  Keys are copied into the
 * slots: the first FL_HK_KEY_MAX bytes, with the full length and a keyed
 * 64-bit hash of the whole key to tell keys with the same prefix apart.
 * Memory is fixed when the tracker is made (fl_hk_bytes), whatever the
 * number of distinct keys.
 */
#ifndef FL_HOTKEYS_H
#define FL_HOTKEYS_H

#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include "fl_native.h"

#define FL_HK_KEY_MAX 64
#define FL_HK_MAX_K 1024
#define FL_HK_MAX_SAMPLE 1000000
#define FL_HK_NEVER INT64_MAX
/* What a slot's key is: a bucket key (CL.CHECK, /v1/check/bucket) or a
 * named rule's bucket key as the engine composes it (CL.LIMIT, /v1/check). */
#define FL_HK_BUCKET 0
#define FL_HK_RULE 1

typedef struct {
    uint64_t hash;
    uint64_t count;      /* sampled checks (halved with time in continuous mode) */
    uint64_t error;      /* Space-Saving's bound on what count overstates */
    uint32_t len;        /* the key's full length; key[] holds min(len, FL_HK_KEY_MAX) */
    uint16_t bucket;     /* its bucket of equal counts */
    uint16_t prev, next; /* its neighbours in that bucket (FL_HK_NIL: none) */
    uint8_t kind;        /* FL_HK_BUCKET or FL_HK_RULE */
    uint8_t pad;
    char key[FL_HK_KEY_MAX];
} fl_hk_slot;

#define FL_HK_NIL 0xFFFF

typedef struct {
    uint64_t count;      /* the count of every counter in it */
    uint16_t head;       /* its first counter */
    uint16_t prev, next; /* the buckets of the next smaller and larger counts (or free list) */
    uint16_t pad;
} fl_hk_bucket;

typedef struct {
    int64_t countdown;   /* checks until the next sampled one; FL_HK_NEVER when off */
    uint32_t k;          /* counters (0: tracking off) */
    uint32_t n;          /* counters in use */
    uint32_t sample;     /* one check in `sample` is offered, on average */
    uint32_t index_mask;
    int active;          /* offers are counted (a stopped session keeps its counts) */
    int64_t interval;    /* the countdown's current interval (checks it covers) */
    int64_t half_life_ms;   /* > 0: continuous mode; 0: a session, nothing decays */
    int64_t start_ms;    /* when this collection began */
    int64_t end_ms;      /* a session's automatic stop (FL_HK_NEVER: none) */
    int64_t stopped_ms;  /* when it stopped (valid while !active) */
    int64_t mark_ms;     /* the last halving (or the start) */
    int64_t covered_ms;  /* time the counts cover up to mark_ms (halved with them) */
    int64_t seen_ms;     /* the latest time seen */
    uint64_t checks;     /* checks seen since start, up to the last sampled one */
    uint64_t sampled;    /* checks offered since start */
    uint64_t rng;
    uint64_t hash_seed;
    fl_hk_slot *slots;
    fl_hk_bucket *buckets;  /* k of them: in use, or free */
    uint16_t bmin;       /* the bucket of the smallest count (FL_HK_NIL: none) */
    uint16_t bfree;      /* the first free bucket */
    uint16_t *index;     /* slot number + 1 by hash, 0 = empty */
} fl_hk;

static inline size_t fl_hk_index_size(uint32_t k) {
    size_t n = 4;
    while (n < 2 * (size_t)k)
        n <<= 1;
    return n;
}

/* The bytes the tracker holds for k counters (the same for any traffic). */
static inline size_t fl_hk_bytes(uint32_t k) {
    if (k == 0)
        return sizeof(fl_hk);
    return sizeof(fl_hk) + (size_t)k * (sizeof(fl_hk_slot) + sizeof(fl_hk_bucket))
        + fl_hk_index_size(k) * sizeof(uint16_t);
}

static inline uint64_t fl_hk_rand(fl_hk *t) {
    uint64_t x = t->rng;          /* xorshift64* */
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    t->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static inline void fl_hk_arm(fl_hk *t) {
    if (!t->active || t->k == 0) {
        t->countdown = FL_HK_NEVER;
        t->interval = 0;
        return;
    }
    t->interval = t->sample <= 1 ? 1
        : 1 + (int64_t)(fl_hk_rand(t) % (2 * (uint64_t)t->sample - 1));
    t->countdown = t->interval;
}

/* Forgets every count and begins a collection at now_ms (active). */
static inline void fl_hk_reset(fl_hk *t, int64_t now_ms) {
    if (t->k > 0) {
        memset(t->index, 0, (t->index_mask + 1) * sizeof(uint16_t));
        for (uint32_t i = 0; i < t->k; i++)
            t->buckets[i].next = i + 1 < t->k ? (uint16_t)(i + 1) : FL_HK_NIL;
    }
    t->bmin = FL_HK_NIL;
    t->bfree = t->k > 0 ? 0 : FL_HK_NIL;
    t->n = 0;
    t->active = 1;
    t->start_ms = t->mark_ms = t->seen_ms = now_ms;
    t->end_ms = FL_HK_NEVER;
    t->stopped_ms = now_ms;
    t->covered_ms = 0;
    t->checks = t->sampled = 0;
    fl_hk_arm(t);
}

static inline void fl_hk_free(fl_hk *t) {
    free(t->slots);
    free(t->buckets);
    free(t->index);
    t->slots = NULL;
    t->buckets = NULL;
    t->index = NULL;
    t->k = t->n = 0;
    t->countdown = FL_HK_NEVER;
}

/* (Re)makes the tracker with k counters (0: off), one check in `sample`
 * offered and the given half-life (0: a session), counting from now_ms.
 * 0, or -1 when k or sample are out of range or memory is short (then the
 * tracker is off, k = 0). */
static inline int fl_hk_init(fl_hk *t, uint32_t k, uint32_t sample, int64_t half_life_ms,
                             int64_t now_ms, uint64_t seed) {
    size_t isize;
    fl_hk_free(t);
    t->sample = sample < 1 ? 1 : sample;
    t->half_life_ms = half_life_ms < 0 ? 0 : half_life_ms;
    t->rng = seed | 1;
    t->hash_seed = fl_hk_rand(t);
    if (k > FL_HK_MAX_K || sample < 1 || sample > FL_HK_MAX_SAMPLE) {
        fl_hk_reset(t, now_ms);
        return -1;
    }
    if (k > 0) {
        isize = fl_hk_index_size(k);
        t->slots = (fl_hk_slot *)calloc(k, sizeof(fl_hk_slot));
        t->buckets = (fl_hk_bucket *)calloc(k, sizeof(fl_hk_bucket));
        t->index = (uint16_t *)calloc(isize, sizeof(uint16_t));
        if (t->slots == NULL || t->buckets == NULL || t->index == NULL) {
            fl_hk_free(t);
            fl_hk_reset(t, now_ms);
            return -1;
        }
        t->index_mask = (uint32_t)(isize - 1);
        t->k = k;
    }
    fl_hk_reset(t, now_ms);
    return 0;
}

/* The check path's test: whether this check is the sampled one. */
static inline int fl_hk_due(fl_hk *t) {
    return --t->countdown == 0;
}

/* ---- the stream-summary ---- */

/* Links bucket nb (count set) after bucket b (FL_HK_NIL: first). */
static inline void fl_hk_blink(fl_hk *t, uint16_t nb, uint16_t b) {
    fl_hk_bucket *x = &t->buckets[nb];
    x->prev = b;
    x->next = b == FL_HK_NIL ? t->bmin : t->buckets[b].next;
    if (x->next != FL_HK_NIL)
        t->buckets[x->next].prev = nb;
    if (b == FL_HK_NIL)
        t->bmin = nb;
    else
        t->buckets[b].next = nb;
}

static inline void fl_hk_bunlink(fl_hk *t, uint16_t b) {
    fl_hk_bucket *x = &t->buckets[b];
    if (x->prev == FL_HK_NIL)
        t->bmin = x->next;
    else
        t->buckets[x->prev].next = x->next;
    if (x->next != FL_HK_NIL)
        t->buckets[x->next].prev = x->prev;
    x->next = t->bfree;          /* back to the free list */
    t->bfree = b;
}

/* A bucket of the given count, from the free list (never empty: there are
 * never more buckets in use than counters). */
static inline uint16_t fl_hk_balloc(fl_hk *t, uint64_t count) {
    uint16_t b = t->bfree;
    t->bfree = t->buckets[b].next;
    t->buckets[b].count = count;
    t->buckets[b].head = FL_HK_NIL;
    return b;
}

static inline void fl_hk_push(fl_hk *t, uint16_t s, uint16_t b) {
    fl_hk_slot *x = &t->slots[s];
    x->bucket = b;
    x->prev = FL_HK_NIL;
    x->next = t->buckets[b].head;
    if (x->next != FL_HK_NIL)
        t->slots[x->next].prev = s;
    t->buckets[b].head = s;
}

/* Takes counter s out of its bucket; whether the bucket is now empty. */
static inline int fl_hk_pull(fl_hk *t, uint16_t s) {
    fl_hk_slot *x = &t->slots[s];
    if (x->prev == FL_HK_NIL)
        t->buckets[x->bucket].head = x->next;
    else
        t->slots[x->prev].next = x->next;
    if (x->next != FL_HK_NIL)
        t->slots[x->next].prev = x->prev;
    return t->buckets[x->bucket].head == FL_HK_NIL;
}

/* One more for counter s: to the bucket of the next count. */
static inline void fl_hk_increment(fl_hk *t, uint16_t s) {
    uint16_t b = t->slots[s].bucket, nb = t->buckets[b].next;
    uint64_t c = t->buckets[b].count + 1;
    t->slots[s].count = c;
    if (nb != FL_HK_NIL && t->buckets[nb].count == c) {
        if (fl_hk_pull(t, s))
            fl_hk_bunlink(t, b);
        fl_hk_push(t, s, nb);
    } else if (t->buckets[b].head == s && t->slots[s].next == FL_HK_NIL) {
        t->buckets[b].count = c;       /* alone: its bucket moves up in place */
    } else {
        fl_hk_pull(t, s);
        nb = fl_hk_balloc(t, c);
        fl_hk_blink(t, nb, b);
        fl_hk_push(t, s, nb);
    }
}

/* A new counter s with count 1 (after the buckets of smaller counts: only
 * a count halved to 0 can be smaller). */
static inline void fl_hk_place_new(fl_hk *t, uint16_t s) {
    uint16_t b = t->bmin, before = FL_HK_NIL;
    while (b != FL_HK_NIL && t->buckets[b].count < 1) {
        before = b;
        b = t->buckets[b].next;
    }
    if (b == FL_HK_NIL || t->buckets[b].count != 1) {
        b = fl_hk_balloc(t, 1);
        fl_hk_blink(t, b, before);
    }
    t->slots[s].count = 1;
    fl_hk_push(t, s, b);
}

static inline int fl_hk_same(const fl_hk_slot *s, uint64_t h, uint8_t kind, const char *key,
                             size_t len) {
    return s->hash == h && s->len == len && s->kind == kind
        && memcmp(s->key, key, len < FL_HK_KEY_MAX ? len : FL_HK_KEY_MAX) == 0;
}

/* Takes slot s out of the index (backward-shift deletion). */
static inline void fl_hk_unindex(fl_hk *t, uint32_t s) {
    uint32_t mask = t->index_mask, i = (uint32_t)t->slots[s].hash & mask, j;
    while (t->index[i] != s + 1)
        i = (i + 1) & mask;
    j = i;
    for (;;) {
        uint32_t home;
        j = (j + 1) & mask;
        if (t->index[j] == 0)
            break;
        home = (uint32_t)t->slots[t->index[j] - 1].hash & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->index[i] = t->index[j];
            i = j;
        }
    }
    t->index[i] = 0;
}

/* Halves every count: monotone, so the buckets keep their order, and
 * neighbours whose halves are equal merge. */
static inline void fl_hk_halve(fl_hk *t) {
    uint16_t b = t->bmin, prev = FL_HK_NIL;
    for (uint32_t i = 0; i < t->n; i++) {
        t->slots[i].count >>= 1;
        t->slots[i].error >>= 1;
    }
    while (b != FL_HK_NIL) {
        uint16_t next = t->buckets[b].next;
        t->buckets[b].count >>= 1;
        if (prev != FL_HK_NIL && t->buckets[prev].count == t->buckets[b].count) {
            while (t->buckets[b].head != FL_HK_NIL) {
                uint16_t s = t->buckets[b].head;
                fl_hk_pull(t, s);
                fl_hk_push(t, s, prev);
            }
            fl_hk_bunlink(t, b);
        } else {
            prev = b;
        }
        b = next;
    }
    t->covered_ms /= 2;
}

/* Brings the tracker to now_ms (the latest time it has seen, so a clock
 * that went back counts nothing), halving counts once per half-life
 * passed since the last halving (continuous mode). */
static inline void fl_hk_advance(fl_hk *t, int64_t now_ms) {
    int64_t hl = t->half_life_ms, periods;
    if (now_ms > t->seen_ms)
        t->seen_ms = now_ms;
    if (hl <= 0 || t->seen_ms - t->mark_ms < hl)
        return;
    periods = (t->seen_ms - t->mark_ms) / hl;
    if (periods > 64) {       /* everything has halved away */
        for (uint32_t i = 0; i < t->n; i++)
            t->slots[i].count = t->slots[i].error = 0;
        t->covered_ms = 0;
        t->mark_ms += (periods - 1) * hl;
        periods = 1;
    }
    while (periods-- > 0) {
        t->covered_ms += hl;
        t->mark_ms += hl;
        fl_hk_halve(t);
    }
}

/* The time the counts cover, as of the latest time seen. */
static inline int64_t fl_hk_covered(const fl_hk *t) {
    return t->covered_ms + (t->seen_ms - t->mark_ms);
}

/* A session past its DURATION stops at its end. */
static inline void fl_hk_expire(fl_hk *t, int64_t now_ms) {
    if (t->active && now_ms >= t->end_ms) {
        fl_hk_advance(t, t->end_ms);
        t->active = 0;
        t->stopped_ms = t->end_ms;
        fl_hk_arm(t);
    }
}

static inline void fl_hk_stop(fl_hk *t, int64_t now_ms) {
    fl_hk_expire(t, now_ms);
    if (t->active) {
        fl_hk_advance(t, now_ms);
        t->active = 0;
        t->stopped_ms = now_ms;
        fl_hk_arm(t);
    }
}

/* The index's hash of a key: a seeded multiply-xorshift, a quarter of
 * SipHash's cost on short keys.  Not collision-proof against a client who
 * learns the seed, but the index is small and probing bounded by its size,
 * so the worst a crafted stream does is lengthen a sampled check's probe. */
static inline uint64_t fl_hk_hash(const char *p, size_t len, uint64_t seed) {
    uint64_t h = seed ^ ((uint64_t)len * 0x9E3779B97F4A7C15ULL), tail = 0;
    while (len >= 8) {
        h = (h ^ fl_load64(p)) * 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 31;
        p += 8;
        len -= 8;
    }
    switch (len) {
    case 7: tail |= ((uint64_t)(uint8_t)p[6]) << 48; /* fall through */
    case 6: tail |= ((uint64_t)(uint8_t)p[5]) << 40; /* fall through */
    case 5: tail |= ((uint64_t)(uint8_t)p[4]) << 32; /* fall through */
    case 4: tail |= ((uint64_t)(uint8_t)p[3]) << 24; /* fall through */
    case 3: tail |= ((uint64_t)(uint8_t)p[2]) << 16; /* fall through */
    case 2: tail |= ((uint64_t)(uint8_t)p[1]) << 8;  /* fall through */
    case 1: tail |= ((uint64_t)(uint8_t)p[0]);       /* fall through */
    case 0: break;
    }
    h = (h ^ tail) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    return h ^ (h >> 32);
}

/* Counts one sampled check of key (Space-Saving's update). */
static inline void fl_hk_count(fl_hk *t, uint8_t kind, const char *key, size_t len) {
    uint64_t h = fl_hk_hash(key, len, t->hash_seed) ^ (kind ? 0x9E3779B97F4A7C15ULL : 0);
    uint32_t mask = t->index_mask, i = (uint32_t)h & mask;
    uint16_t s;
    fl_hk_slot *slot;
    while (t->index[i] != 0) {
        s = (uint16_t)(t->index[i] - 1);
        if (fl_hk_same(&t->slots[s], h, kind, key, len)) {
            fl_hk_increment(t, s);
            return;
        }
        i = (i + 1) & mask;
    }
    if (t->n < t->k) {
        s = (uint16_t)t->n++;
        slot = &t->slots[s];
        slot->error = 0;
        fl_hk_place_new(t, s);
    } else {
        /* take over a counter of the smallest count c: count c + 1, error c */
        s = t->buckets[t->bmin].head;
        slot = &t->slots[s];
        fl_hk_unindex(t, s);
        slot->error = slot->count;
        fl_hk_increment(t, s);
        /* the index moved: find the new key's free place again */
        i = (uint32_t)h & mask;
        while (t->index[i] != 0)
            i = (i + 1) & mask;
    }
    slot->hash = h;
    slot->len = (uint32_t)(len > UINT32_MAX ? UINT32_MAX : len);
    slot->kind = kind;
    memcpy(slot->key, key, len < FL_HK_KEY_MAX ? len : FL_HK_KEY_MAX);
    t->index[i] = (uint16_t)(s + 1);
}

/* Called when fl_hk_due said so: whether this check is counted (tracking
 * is on and its session has not ended), with the countdown re-armed and
 * the checks the interval covered added. */
static inline int fl_hk_begin(fl_hk *t, int64_t now_ms) {
    if (!t->active || t->k == 0) {
        fl_hk_arm(t);
        return 0;
    }
    if (now_ms >= t->end_ms) {
        fl_hk_expire(t, now_ms);
        return 0;
    }
    t->checks += (uint64_t)t->interval;
    t->sampled++;
    fl_hk_advance(t, now_ms);
    fl_hk_arm(t);
    return 1;
}

/* One sampled check of one key: fl_hk_begin then fl_hk_count. */
static inline void fl_hk_offer(fl_hk *t, uint8_t kind, const char *key, size_t len,
                               int64_t now_ms) {
    if (fl_hk_begin(t, now_ms))
        fl_hk_count(t, kind, key, len);
}

#endif /* FL_HOTKEYS_H */
