"""Which of a fixed set of names a Redis glob matches (CONFIG GET's
patterns), in time linear in the pattern."""

from __future__ import annotations

import re


class NameMatcher:
    """Which of a fixed set of names a pattern matches, by the rules of
    Redis's stringmatchlen with nocase (``*``, ``?``, ``[...]`` with ``^``,
    ranges and ``\\`` escapes, ``\\`` outside classes), in time linear in
    the pattern.

    Redis backtracks (with a guard against going exponential on
    ``*a*a*a...b``); here every name is followed at once, bit-parallel.
    Bit ``p`` of the state is one position in one name: "the tokens read so
    far match that name up to here".  The names' positions sit in one
    integer, each name followed by a gap wider than the longest name, so
    that the shifts below never carry from one name into the next.  A token
    costs a few integer operations, and a state with no bit left can match
    nothing: as every token but ``*`` consumes one character, that happens
    within longest-name + 1 of them, so even a huge pattern is read only as
    far as it can matter."""

    def __init__(self, names: list[str]):
        longest = max(map(len, names))
        # 1, 2, 4...: together they fill a whole name, and none jumps a gap
        self.fill_shifts = [1 << k for k in range(longest.bit_length())]
        self.start = self.ends = self.valid = 0
        self.next_char: dict[int, int] = {}     # byte -> positions it follows
        self.end_of: dict[int, str] = {}        # end position -> name
        offset = 0
        for name in names:
            self.start |= 1 << offset
            self.end_of[offset + len(name)] = name
            self.ends |= 1 << (offset + len(name))
            self.valid |= ((1 << (len(name) + 1)) - 1) << offset
            for i, ch in enumerate(name.encode()):
                self.next_char[ch] = self.next_char.get(ch, 0) | 1 << (offset + i)
            offset += len(name) + 1 + longest + 1
        self.any_char = self.valid & ~self.ends
        self.with_lower: dict[int, list[int]] = {}     # lowered byte -> the names' bytes
        for ch in self.next_char:
            self.with_lower.setdefault(_lower(ch), []).append(ch)
        self.literal = [self._positions(self.with_lower.get(_lower(b), ())) for b in range(256)]

    def _positions(self, chars) -> int:
        """Positions followed by one of chars."""
        out = 0
        for ch in chars:
            out |= self.next_char[ch]
        return out

    def match(self, pattern: bytes, classes: dict) -> list[str]:
        """The names pattern matches; classes caches class tokens' positions
        (for one command: it grows with what the client sent)."""
        state, i, n = self.start, 0, len(pattern)
        while i < n and state:
            ch = pattern[i]
            if ch == _STAR:
                i = _must_match(_STARS, pattern, i).end()
                for shift in self.fill_shifts:
                    state |= (state << shift) & self.valid
                continue
            if ch == _QUESTION:
                positions, i = self.any_char, i + 1
            elif ch == _OPEN:
                positions, i = self._class(pattern, i, classes)
            else:
                if ch == _BACKSLASH and i + 1 < n:
                    i += 1
                positions, i = self.literal[pattern[i]], i + 1
            state = (state & positions) << 1
        state &= self.ends
        return [name for end, name in self.end_of.items() if state >> end & 1]

    def _class(self, pattern: bytes, i: int, classes: dict) -> tuple[int, int]:
        """The positions the ``[...]`` token at pattern[i] admits, and
        where the token ends."""
        end = _must_match(_CLASS, pattern, i).end()
        text = pattern[i:end]
        end += pattern[end:end + 1] == b"]"      # a closing "]"; else the pattern ended
        positions = classes.get(text)
        if positions is None:
            positions = classes[text] = self._positions(self._class_chars(text))
        return positions, end

    def _class_chars(self, text: bytes) -> set[int]:
        """The names' bytes a class token (without its closing "]") admits:
        escaped bytes compare exactly, other bytes and ranges without case,
        a reversed range is swapped first, all as stringmatchlen does."""
        negate = text[1:2] == b"^"
        exact, folded, ranges = set(), set(), set()     # a long class repeats itself
        for m in _CLASS_ITEMS.finditer(text, 2 if negate else 1):
            escaped, low, high, plain = m.groups()
            if escaped is not None:
                exact.add(escaped[0])
            elif plain is not None:
                folded.add(_lower(plain[0]))
            else:
                ranges.add(tuple(map(_lower, sorted((low[0], high[0])))))
        chars = exact & self.next_char.keys()
        for f in folded:
            chars.update(self.with_lower.get(f, ()))
        for low, high in ranges:
            chars.update(c for c in self.next_char if low <= _lower(c) <= high)
        return self.next_char.keys() - chars if negate else chars


_STAR, _QUESTION, _OPEN, _BACKSLASH = b"*?[\\"
_STARS = re.compile(rb"\*+")


def _must_match(regex: re.Pattern[bytes], text: bytes, pos: int) -> re.Match[bytes]:
    """regex.match where the caller knows it matches (the token starts there)."""
    m = regex.match(text, pos)
    assert m is not None
    return m


# A class as stringmatchlen reads it: "[", an optional "^", then items in
# this order of preference: an escaped byte, a range "a-z" (whose end may
# be "]" or "\\"), any byte but "]"; then "]", or the end of the pattern.
_CLASS_ITEM = rb"\\(.)|([^\]\\])-(.)|([^\]])"
_CLASS_ITEMS = re.compile(_CLASS_ITEM, re.DOTALL)
_CLASS = re.compile(rb"\[\^?(?:\\.|[^\]\\]-.|[^\]])*+", re.DOTALL)


def _lower(c: int) -> int:
    return c + 32 if 65 <= c <= 90 else c
