# Included by _protocol.pyx: Redis's glob (util.c stringmatchlen), as
# PSUBSCRIBE, PUBSUB CHANNELS and ACL key patterns match.  Declared in
# _protocol.pxd.


cdef inline bint glob_token(const char* p, size_t n, size_t i, char ch,
                            size_t* end) noexcept:
    """Whether the one-byte token at p[i] ('?', a class, an escaped or a
    plain byte) admits ch; *end is where the token ends.  Classes read as
    stringmatchlen reads them: "^" negates, "\\" escapes, "x-y" is a range
    (reversed ones swapped, bytes compared as C's signed char, and its end
    may be "]"), and one the pattern ends inside takes the rest."""
    cdef size_t j
    cdef bint negate, found = False
    cdef signed char lo, hi, t
    if p[i] == c'?':
        end[0] = i + 1
        return True
    if p[i] == c'[':
        j = i + 1
        negate = j < n and p[j] == c'^'
        if negate:
            j += 1
        while True:
            if j < n and p[j] == c'\\' and n - j >= 2:
                j += 1
                found = found or p[j] == ch
            elif j < n and p[j] == c']':
                break
            elif j >= n:
                j -= 1          # the class ran to the end of the pattern
                break
            elif n - j >= 3 and p[j + 1] == c'-':
                lo, hi = <signed char>p[j], <signed char>p[j + 2]
                if lo > hi:
                    t = lo
                    lo = hi
                    hi = t
                j += 2
                found = found or lo <= <signed char>ch <= hi
            else:
                found = found or p[j] == ch
            j += 1
        end[0] = j + 1
        return found != negate
    if p[i] == c'\\' and n - i >= 2:
        i += 1
    end[0] = i + 1
    return p[i] == ch


cdef bint glob_match(const char* p, size_t n, const char* s, size_t m) noexcept:
    """Redis's stringmatchlen, case-sensitive, without its recursion.
    Every token but "*" takes exactly one byte, so on a mismatch only the
    last "*" needs to take one byte more (an earlier one taking more
    could only move the rest later, where it was already tried): the
    time is at most O(n * m), with no stack.  Like stringmatchlen, an
    empty string matches only the empty pattern ("*" included)."""
    cdef size_t pi = 0, si = 0, end = 0, star_p = 0, star_s = 0
    cdef bint starred = False
    if m == 0:
        return n == 0
    while si < m:
        if pi < n and p[pi] == c'*':
            while pi < n and p[pi] == c'*':
                pi += 1
            if pi == n:
                return True
            starred, star_p, star_s = True, pi, si
            continue
        if pi < n and glob_token(p, n, pi, s[si], &end):
            pi = end
            si += 1
            continue
        if not starred:
            return False
        star_s += 1
        si, pi = star_s, star_p
    while pi < n and p[pi] == c'*':
        pi += 1
    return pi == n


def glob(bytes pattern, bytes string):
    """Whether pattern matches string by Redis's stringmatchlen rules
    (case-sensitive), as PSUBSCRIBE and PUBSUB CHANNELS match."""
    return glob_match(PyBytes_AS_STRING(pattern), PyBytes_GET_SIZE(pattern),
                      PyBytes_AS_STRING(string), PyBytes_GET_SIZE(string))
