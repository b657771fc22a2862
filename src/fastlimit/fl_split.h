/* Split keys: a hot key's bucket made k sub-buckets, each under a sub-key
 * whose Redis Cluster hash slot differs, so that in cluster mode they live
 * on different shards.
 *
 * The naming is the one a client of any Redis Cluster library can follow
 * by itself: sub-bucket i of key K is K with "#i" (i in decimal, no
 * leading zero) inserted at the end of K's hashed part, the part Redis
 * hashes to a slot: the bytes between the first '{' and the first '}'
 * after it when there are some, else the whole key.  So "user:42" has the
 * sub-keys "user:42#0" ... and "a{acme}b" the sub-keys "a{acme#0}b" ...;
 * the suffix is inside the hashed part, so a hash tag does not pin every
 * sub-key to one slot.
 *
 * Sub-bucket i of a capacity C split k ways holds C / k, one more for the
 * first C mod k, so the shares add up to C exactly, and refills at 1/k of
 * the rate.  Pure C, explicit returns, no allocation.
 */
#ifndef FL_SPLIT_H
#define FL_SPLIT_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define FL_SPLIT_MAX 64          /* sub-buckets of one key at most */
#define FL_SPLIT_SUFFIX_MAX 3    /* "#63" */

/* The offset just past the key's hashed part (see above). */
static inline size_t fl_split_hashed_end(const char *key, size_t n)
{
    const char *open = memchr(key, '{', n);
    const char *close;
    if (open != NULL) {
        close = memchr(open + 1, '}', n - (size_t)(open - key) - 1);
        if (close != NULL && close != open + 1)
            return (size_t)(close - key);
    }
    return n;
}

/* Whether key is a sub-key of some base key for a split of k: its hashed
 * part ends with "#i", 0 <= i < k.  Then *index is i and *suffix_at the
 * offset of the '#' (the base key is the key without those bytes). */
static inline int fl_split_parse(const char *key, size_t n, int k, int *index,
                                 size_t *suffix_at)
{
    size_t end = fl_split_hashed_end(key, n), at;
    int i;
    if (end >= 2 && key[end - 2] == '#' && key[end - 1] >= '0' && key[end - 1] <= '9') {
        at = end - 2;
        i = key[end - 1] - '0';
    } else if (end >= 3 && key[end - 3] == '#' && key[end - 2] >= '1' && key[end - 2] <= '9'
               && key[end - 1] >= '0' && key[end - 1] <= '9') {
        at = end - 3;
        i = (key[end - 2] - '0') * 10 + (key[end - 1] - '0');
    } else {
        return 0;
    }
    if (i >= k)
        return 0;
    *index = i;
    *suffix_at = at;
    return 1;
}

/* Writes into out (room for n bytes) the base key of a sub-key that
 * fl_split_parse read (index, suffix_at); returns its length. */
static inline size_t fl_split_base(const char *key, size_t n, int index, size_t suffix_at,
                                   char *out)
{
    size_t cut = index < 10 ? 2 : 3;
    memcpy(out, key, suffix_at);
    memcpy(out + suffix_at, key + suffix_at + cut, n - suffix_at - cut);
    return n - cut;
}

/* Writes sub-key i of base[0:n] into out (room for n + FL_SPLIT_SUFFIX_MAX
 * bytes); returns its length. */
static inline size_t fl_split_subkey(const char *base, size_t n, int i, char *out)
{
    size_t end = fl_split_hashed_end(base, n), s = 1;
    char suffix[FL_SPLIT_SUFFIX_MAX];
    suffix[0] = '#';
    if (i >= 10)
        suffix[s++] = (char)('0' + i / 10);
    suffix[s++] = (char)('0' + i % 10);
    memcpy(out, base, end);
    memcpy(out + end, suffix, s);
    memcpy(out + end + s, base + end, n - end);
    return n + s;
}

/* Sub-bucket i's share of a total split k ways. */
static inline int64_t fl_split_share(int64_t total, int k, int i)
{
    return total / k + (i < total % k);
}

/* xorshift64*: the engine's choice of a sub-bucket; state never 0. */
static inline uint64_t fl_split_random(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

#endif
