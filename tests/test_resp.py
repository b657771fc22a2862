"""The RESP request parser, unit by unit, through ``fastlimit._resp.parse``.

``parse(data, max_bulk_len=, max_multibulk_len=, unauthenticated=)`` runs
the connection's parser over ``data`` and returns ``(commands, consumed,
error)``: every complete command, the bytes they used, and the protocol
error text that stopped parsing (``None`` when the rest is incomplete).

Expected texts and splitting rules are Redis 7's (networking.c
processMultibulkBuffer / processInlineBuffer, sds.c sdssplitargs); where a
case says "as redis-server" it was checked against a real redis-server
7.0 (tests/server/test_protocol.py repeats those comparisons live).

The fuzz part (seeded, bounded) checks the properties a connection
relies on: a prefix of valid input never errors and yields only complete
commands; feeding bytes in any chunking gives what one parse of the
whole gives; no input crashes; huge declared lengths cost nothing until
the data arrives.

``parse_stream(chunks, ...)`` keeps one parser across reads, as a
connection does: an incomplete command resumes where it stopped (Redis's
processMultibulkBuffer), in a buffer that moves between reads.  Every
split of every frame must give what one read gives.
"""

from __future__ import annotations

import random
import time

import pytest

from fastlimit._resp import parse, parse_stream
from wire import command

PE = "ERR Protocol error: "
INVALID_MBULK = PE + "invalid multibulk length"
INVALID_BULK = PE + "invalid bulk length"
UNBALANCED = PE + "unbalanced quotes in request"
TOO_BIG_INLINE = PE + "too big inline request"
TOO_BIG_MBULK = PE + "too big mbulk count string"
TOO_BIG_BULK = PE + "too big bulk count string"
UNAUTH_MBULK = PE + "unauthenticated multibulk length"
UNAUTH_BULK = PE + "unauthenticated bulk length"
BAD_BULK_END = PE + "expected CRLF after bulk data"
INLINE_MAX = 64 * 1024          # Redis's PROTO_INLINE_MAX_SIZE
MAX_BULK_DEFAULT = 512 * 1024 * 1024


def expected_dollar(c: str) -> str:
    return PE + f"expected '$', got '{c}'"


# ---- valid input --------------------------------------------------------------

VALID = [
    ("ping", command(b"PING"), [[b"PING"]]),
    ("cl.check", command(b"CL.CHECK", b"k", b"5", b"2"), [[b"CL.CHECK", b"k", b"5", b"2"]]),
    ("lowercase", command(b"ping", b"hello"), [[b"ping", b"hello"]]),
    ("empty bulk", command(b"ECHO", b""), [[b"ECHO", b""]]),
    ("binary bulk with CRLF and markers inside",
     command(b"ECHO", b"a\r\n*1\r\n$4\r\n\x00\xff"), [[b"ECHO", b"a\r\n*1\r\n$4\r\n\x00\xff"]]),
    ("bulk of only CRLF", command(b"ECHO", b"\r\n"), [[b"ECHO", b"\r\n"]]),
    ("many args (argv grows past its first size)",
     command(b"ECHO", *[b"%d" % i for i in range(300)]),
     [[b"ECHO", *[b"%d" % i for i in range(300)]]]),
    ("100 kB bulk", command(b"ECHO", b"z" * 100_000), [[b"ECHO", b"z" * 100_000]]),
    ("*0 ignored", b"*0\r\n", []),
    ("*-1 ignored", b"*-1\r\n", []),
    ("*-5 ignored", b"*-5\r\n", []),
    ("*INT64_MIN ignored", b"*-9223372036854775808\r\n", []),
    ("bare CRLF ignored", b"\r\n", []),
    ("bare LF ignored", b"\n", []),
    ("blank line ignored", b"   \t \r\n", []),
    ("several empties", b"\r\n\r\n*0\r\n\n*-1\r\n", []),
]


@pytest.mark.parametrize("data, commands", [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_multibulk(data, commands):
    assert parse(data) == (commands, len(data), None)


def test_pipelined_mixed_frames():
    data = (command(b"PING") + b"PING\r\n" + command(b"ECHO", b"a") + b"\r\n" + b"*0\r\n"
            + b"ECHO b\n" + command(b"CL.CHECK", b"k", b"5", b"2") + b"*-1\r\n"
            + b'ECHO "c d"\r\n')
    assert parse(data) == ([[b"PING"], [b"PING"], [b"ECHO", b"a"], [b"ECHO", b"b"],
                            [b"CL.CHECK", b"k", b"5", b"2"], [b"ECHO", b"c d"]],
                           len(data), None)


def test_pipeline_of_a_thousand():
    frame = command(b"CL.CHECK", b"key", b"5", b"2")
    assert parse(frame * 1000) == ([[b"CL.CHECK", b"key", b"5", b"2"]] * 1000,
                                   len(frame) * 1000, None)


def test_huge_command_then_small_ones():
    # argv grows to 5000 entries and is trimmed again for the next command
    big = command(b"ECHO", *[b"a"] * 4999)
    data = big + command(b"PING") + b"PING x\r\n" + big + command(b"PING")
    commands, used, err = parse(data)
    assert (used, err) == (len(data), None)
    assert [len(c) for c in commands] == [5000, 1, 2, 5000, 1]
    assert commands[1:3] == [[b"PING"], [b"PING", b"x"]]


# ---- inline commands ----------------------------------------------------------

INLINE = [
    ("ping crlf", b"PING\r\n", [b"PING"]),
    ("ping lf only", b"PING\n", [b"PING"]),
    ("cl.check", b"CL.CHECK k 5 2\r\n", [b"CL.CHECK", b"k", b"5", b"2"]),
    ("extra blanks", b"  ECHO \t  a \r\n", [b"ECHO", b"a"]),
    ("lone CR splits (as redis-server)", b"PING\rPING\r\n", [b"PING", b"PING"]),
    ("double quotes keep spaces", b'ECHO "a b"\r\n', [b"ECHO", b"a b"]),
    ("empty double quotes", b'ECHO ""\r\n', [b"ECHO", b""]),
    ("empty single quotes", b"ECHO ''\r\n", [b"ECHO", b""]),
    ("two quoted args", b'ECHO "a" "b c"\r\n', [b"ECHO", b"a", b"b c"]),
    ("hex escapes", b'ECHO "\\x41\\x4a\\x4B\\x00"\r\n', [b"ECHO", b"AJK\x00"]),
    ("hex escape high byte", b'ECHO "\\xff\\xFE"\r\n', [b"ECHO", b"\xff\xfe"]),
    ("incomplete hex escape (as redis-server)", b'ECHO "a\\x4"\r\n', [b"ECHO", b"ax4"]),
    ("bad hex digits", b'ECHO "\\xZZ"\r\n', [b"ECHO", b"xZZ"]),
    ("control escapes", b'ECHO "\\n\\r\\t\\b\\a"\r\n', [b"ECHO", b"\n\r\t\b\a"]),
    ("escaped quote and backslash", b'ECHO "say \\"hi\\" \\\\o/"\r\n',
     [b"ECHO", b'say "hi" \\o/']),
    ("other escapes keep the char", b'ECHO "\\q\\z"\r\n', [b"ECHO", b"qz"]),
    ("single quotes keep spaces", b"ECHO 'a b'\r\n", [b"ECHO", b"a b"]),
    ("single quotes: only \\' is an escape", b"ECHO 'it\\'s \\n \\x41'\r\n",
     [b"ECHO", b"it's \\n \\x41"]),
    ("double quote inside single quotes", b"ECHO 'a\"b'\r\n", [b"ECHO", b'a"b']),
    ("quoted arg at end of line without CRLF", b'ECHO "a b"\n', [b"ECHO", b"a b"]),
    ("quoted command name", b'"PING"\r\n', [b"PING"]),
    ("many args", b"ECHO " + b"x " * 100 + b"\r\n", [b"ECHO"] + [b"x"] * 100),
    ("binary bytes", b"ECHO \x00\xff\x80\r\n", [b"ECHO", b"\x00\xff\x80"]),
    ("line over 64 kB that arrived whole", b"ECHO " + b"a" * 70_000 + b"\r\n",
     [b"ECHO", b"a" * 70_000]),
]


@pytest.mark.parametrize("data, args", [c[1:] for c in INLINE], ids=[c[0] for c in INLINE])
def test_inline(data, args):
    assert parse(data) == ([args], len(data), None)


# What redis-server 7.0 does with these lines (sdssplitargs), checked on a
# real redis-server; see test_protocol.py::test_inline_splitting_matches_redis.
INLINE_AS_REDIS = [
    ("quote opens mid-token", b'ECHO a"b c"\r\n', [b"ECHO", b"ab c"]),
    ("single quote opens mid-token", b"ECHO a'b c'\r\n", [b"ECHO", b"ab c"]),
    ("vertical tab only separates between tokens", b"ECHO a\x0bb\r\n", [b"ECHO", b"a\x0bb"]),
    ("single quotes: backslash before backslash is literal", b"ECHO 'a\\\\'\r\n", UNBALANCED),
]


@pytest.mark.parametrize("data, expected", [c[1:] for c in INLINE_AS_REDIS],
                         ids=[c[0] for c in INLINE_AS_REDIS])
def test_inline_splits_like_sdssplitargs(data, expected):
    if isinstance(expected, str):
        assert parse(data) == ([], 0, expected)
    else:
        assert parse(data) == ([expected], len(data), None)


# ---- errors -------------------------------------------------------------------

ERRORS = [
    # "*<count>" lines
    ("mbulk letters", b"*abc\r\n", INVALID_MBULK, {}),
    ("mbulk empty", b"*\r\n", INVALID_MBULK, {}),
    ("mbulk minus only", b"*-\r\n", INVALID_MBULK, {}),
    ("mbulk minus zero", b"*-0\r\n", INVALID_MBULK, {}),
    ("mbulk plus sign", b"*+1\r\n", INVALID_MBULK, {}),
    ("mbulk leading zero", b"*01\r\n", INVALID_MBULK, {}),
    ("mbulk leading space", b"* 1\r\n", INVALID_MBULK, {}),
    ("mbulk trailing space", b"*1 \r\n", INVALID_MBULK, {}),
    ("mbulk CR without LF", b"*1\rx\n", INVALID_MBULK, {}),
    ("mbulk INT64_MAX+1", b"*9223372036854775808\r\n", INVALID_MBULK, {}),
    ("mbulk 20 digits overflow", b"*99999999999999999999\r\n", INVALID_MBULK, {}),
    ("mbulk 21 digits", b"*123456789012345678901\r\n", INVALID_MBULK, {}),
    ("mbulk below INT64_MIN", b"*-9223372036854775809\r\n", INVALID_MBULK, {}),
    ("mbulk over INT_MAX", b"*2147483648\r\n", INVALID_MBULK, {}),
    ("mbulk over the default 1M", b"*1048577\r\n", INVALID_MBULK, {}),
    ("mbulk over a custom limit", b"*11\r\n", INVALID_MBULK, {"max_multibulk_len": 10}),
    ("mbulk count string too big", b"*" + b"1" * INLINE_MAX, TOO_BIG_MBULK, {}),
    # "$<len>" lines
    ("bulk letters", b"*1\r\n$abc\r\n", INVALID_BULK, {}),
    ("bulk empty", b"*1\r\n$\r\n", INVALID_BULK, {}),
    ("bulk -1", b"*1\r\n$-1\r\n", INVALID_BULK, {}),
    ("bulk minus zero", b"*1\r\n$-0\r\n", INVALID_BULK, {}),
    ("bulk negative", b"*2\r\n$4\r\nECHO\r\n$-5\r\n", INVALID_BULK, {}),
    ("bulk plus sign", b"*1\r\n$+4\r\nPING\r\n", INVALID_BULK, {}),
    ("bulk leading zero", b"*1\r\n$04\r\nPING\r\n", INVALID_BULK, {}),
    ("bulk leading space", b"*1\r\n$ 4\r\nPING\r\n", INVALID_BULK, {}),
    ("bulk trailing space", b"*1\r\n$4 \r\nPING\r\n", INVALID_BULK, {}),
    ("bulk LF without CR", b"*1\r\n$4\nPING\r\n", INVALID_BULK, {}),
    ("bulk overflow", b"*1\r\n$99999999999999999999\r\n", INVALID_BULK, {}),
    ("bulk INT64_MAX+1", b"*1\r\n$9223372036854775808\r\n", INVALID_BULK, {}),
    ("bulk 2000000000 over 512MB", b"*3\r\n$2000000000\r\n", INVALID_BULK, {}),
    ("bulk 512MB+1", b"*1\r\n$536870913\r\n", INVALID_BULK, {}),
    ("bulk over a custom limit", b"*2\r\n$4\r\nECHO\r\n$1025\r\n", INVALID_BULK,
     {"max_bulk_len": 1024}),
    ("bulk count string too big", b"*1\r\n$" + b"1" * INLINE_MAX, TOO_BIG_BULK, {}),
    # what follows the count
    ("expected $ got x", b"*1\r\nx\r\n", expected_dollar("x"), {}),
    ("expected $ got colon", b"*2\r\n$4\r\nECHO\r\n:1\r\n", expected_dollar(":"), {}),
    ("expected $ got star", b"*1\r\n*1\r\n", expected_dollar("*"), {}),
    ("expected $ got plus", b"*1\r\n+PING\r\n", expected_dollar("+"), {}),
    ("expected $ got CR", b"*1\r\n\r\n", expected_dollar("\r"), {}),
    ("expected $ before its line ends", b"*1\r\nx", expected_dollar("x"), {}),
    # bulk terminator
    ("bulk data too long", b"*1\r\n$3\r\nPINGxx", BAD_BULK_END, {}),
    ("bulk end LF CR", b"*1\r\n$4\r\nPING\n\r", BAD_BULK_END, {}),
    ("bulk end CR X", b"*1\r\n$4\r\nPING\rX", BAD_BULK_END, {}),
    ("second bulk bad end", command(b"ECHO", b"a")[:-2] + b"xx", BAD_BULK_END, {}),
    # inline
    ("too big inline", b"x" * (INLINE_MAX + 1), TOO_BIG_INLINE, {}),
    ("unbalanced double", b'ECHO "abc\r\n', UNBALANCED, {}),
    ("unbalanced single", b"ECHO 'abc\r\n", UNBALANCED, {}),
    ("unbalanced escaped close", b'ECHO "abc\\"\r\n', UNBALANCED, {}),
    ("lone double quote", b'"\r\n', UNBALANCED, {}),
    ("text after closing double", b'ECHO "a"b\r\n', UNBALANCED, {}),
    ("text after closing single", b"ECHO 'a'b\r\n", UNBALANCED, {}),
    # unauthenticated clients
    ("unauth 11 args", b"*11\r\n", UNAUTH_MBULK, {"unauthenticated": True}),
    ("unauth 16385-byte bulk", b"*2\r\n$4\r\nAUTH\r\n$16385\r\n", UNAUTH_BULK,
     {"unauthenticated": True}),
    ("unauth: invalid beats unauthenticated", b"*1\r\n$536870913\r\n", INVALID_BULK,
     {"unauthenticated": True}),
    ("unauth: invalid mbulk beats unauthenticated", b"*1048577\r\n", INVALID_MBULK,
     {"unauthenticated": True}),
]


@pytest.mark.parametrize("data, error, kwargs", [c[1:] for c in ERRORS],
                         ids=[c[0] for c in ERRORS])
def test_protocol_error(data, error, kwargs):
    assert parse(data, **kwargs) == ([], 0, error)


@pytest.mark.parametrize("bad, error", [
    (b"*1\r\n$abc\r\n", INVALID_BULK),
    (b'ECHO "x\r\n', UNBALANCED),
    (b"*1\r\nx\r\n", expected_dollar("x")),
])
def test_error_after_good_commands_keeps_them(bad, error):
    good = command(b"PING") + b"PING\r\n\r\n" + command(b"ECHO", b"a")
    assert parse(good + bad + command(b"PING")) == (
        [[b"PING"], [b"PING"], [b"ECHO", b"a"]], len(good), error)


LIMITS_OK = [
    ("10 args unauthenticated", b"*10\r\n", {"unauthenticated": True}),
    ("11 args authenticated", b"*11\r\n", {}),
    ("16384-byte bulk unauthenticated", b"*2\r\n$4\r\nAUTH\r\n$16384\r\n",
     {"unauthenticated": True}),
    ("bulk exactly at the custom limit", b"*1\r\n$1024\r\n", {"max_bulk_len": 1024}),
    ("512MB bulk exactly", b"*1\r\n$536870912\r\n", {}),
    ("mbulk exactly at the custom limit", b"*10\r\n", {"max_multibulk_len": 10}),
    ("1M args exactly", b"*1048576\r\n", {}),
    ("inline 64kB without newline", b"x" * INLINE_MAX, {}),
    ("mbulk count string 64kB", b"*" + b"1" * (INLINE_MAX - 1), {}),
    ("bulk count string 64kB", b"*1\r\n$" + b"1" * (INLINE_MAX - 1), {}),
]


@pytest.mark.parametrize("data, kwargs", [c[1:] for c in LIMITS_OK],
                         ids=[c[0] for c in LIMITS_OK])
def test_at_the_limits_is_just_incomplete(data, kwargs):
    assert parse(data, **kwargs) == ([], 0, None)


def test_limits_apply_per_kwarg():
    frame = command(b"ECHO", b"a" * 1024)
    assert parse(frame, max_bulk_len=1024) == ([[b"ECHO", b"a" * 1024]], len(frame), None)
    assert parse(frame, max_bulk_len=1023) == ([], 0, INVALID_BULK)
    args = command(*[b"a"] * 10)
    assert parse(args, unauthenticated=True) == ([[b"a"] * 10], len(args), None)
    assert parse(args, max_multibulk_len=9) == ([], 0, INVALID_MBULK)
    big = command(b"AUTH", b"p" * 16384)
    assert parse(big, unauthenticated=True) == ([[b"AUTH", b"p" * 16384]], len(big), None)


INCOMPLETE = [
    b"*", b"*1", b"*1\r", b"*1\r\n", b"*1\r\n$", b"*1\r\n$4", b"*1\r\n$4\r",
    b"*1\r\n$4\r\n", b"*1\r\n$4\r\nPI", b"*1\r\n$4\r\nPING", b"*1\r\n$4\r\nPING\r",
    b"*2\r\n$4\r\nECHO\r\n", b"*3\n", b"*1\n$4\nPING\n",
    b"P", b"PING", b"PING\r", b'ECHO "unterminated', b"ECHO 'a b",
]


@pytest.mark.parametrize("data", INCOMPLETE)
def test_incomplete_returns_nothing_yet(data):
    assert parse(data) == ([], 0, None)


def test_incomplete_tail_after_commands():
    head = command(b"PING") + b"PING\r\n"
    for tail in INCOMPLETE:
        assert parse(head + tail) == ([[b"PING"], [b"PING"]], len(head), None), tail


# ---- fuzzing --------------------------------------------------------------------

VALID_FRAMES = [
    command(b"PING"),
    command(b"CL.CHECK", b"user:42", b"5", b"2", b"COST", b"3"),
    command(b"ECHO", b""),
    command(b"ECHO", b"a\r\nb\r\n*2\r\n$1\r\n"),
    command(b"ECHO", bytes(range(256))),
    command(*[b"x" * i for i in range(1, 20)]),
    b"*0\r\n",
    b"*-1\r\n",
    b"\r\n",
    b"PING\r\n",
    b"PING\n",
    b"CL.CHECK k 5 2\r\n",
    b'ECHO "a b" \'c d\' "\\x41\\n"\r\n',
    b"  ECHO   spaced\t\targs  \r\n",
]


def check_result_shape(result, data):
    commands, used, err = result
    assert isinstance(commands, list)
    for cmd in commands:
        assert isinstance(cmd, list) and cmd, cmd
        assert all(isinstance(a, bytes) for a in cmd)
    assert isinstance(used, int) and 0 <= used <= len(data)
    assert err is None or (isinstance(err, str) and err.startswith(PE)), err


def feed(chunks, **kwargs):
    """What a connection does: append each read to a buffer, parse every
    complete command, keep the rest.  Stops at the first error."""
    buf, out = b"", []
    for chunk in chunks:
        buf += chunk
        commands, used, err = parse(buf, **kwargs)
        check_result_shape((commands, used, err), buf)
        out += commands
        if err is not None:
            return out, err, buf
        buf = buf[used:]
    return out, None, buf


def split(data: bytes, sizes) -> list[bytes]:
    out, i = [], 0
    for n in sizes:
        if i >= len(data):
            break
        out.append(data[i:i + n])
        i += n
    if i < len(data):
        out.append(data[i:])
    return out


@pytest.mark.parametrize("frame", VALID_FRAMES, ids=lambda f: repr(f[:24]))
def test_every_prefix_of_a_valid_frame_is_incomplete_not_an_error(frame):
    commands, used, err = parse(frame)
    assert err is None and used == len(frame)
    for k in range(len(frame)):
        assert parse(frame[:k]) == ([], 0, None), (k, frame[:k])
    assert feed([frame[i:i + 1] for i in range(len(frame))]) == (commands, None, b"")


def test_prefixes_of_a_pipeline_give_only_complete_commands():
    data = b"".join(VALID_FRAMES)
    everything, used, err = parse(data)
    assert (used, err) == (len(data), None)
    boundaries = []
    pos = 0
    for f in VALID_FRAMES:
        pos += len(f)
        boundaries.append((pos, len(parse(data[:pos])[0])))
    for k in range(len(data) + 1):
        commands, used, err = parse(data[:k])
        assert err is None, (k, err)
        assert commands == everything[:len(commands)], k
        # exactly the frames that ended at or before k were used
        expected_used = max([b for b, _ in boundaries if b <= k], default=0)
        assert used == expected_used, k


def test_pipeline_fed_one_byte_at_a_time():
    data = b"".join(VALID_FRAMES) * 3
    everything = parse(data)[0]
    assert feed([data[i:i + 1] for i in range(len(data))]) == (everything, None, b"")


def test_pipeline_fed_in_random_chunks():
    rng = random.Random(1234)
    data = b"".join(VALID_FRAMES) * 4 + command(b"ECHO", b"q" * 5000)
    everything = parse(data)[0]
    for _ in range(200):
        sizes = [rng.choice((1, 2, 3, 7, 16, 100, 1000)) for _ in range(len(data))]
        assert feed(split(data, sizes)) == (everything, None, b"")


ALPHABET = b"*$\r\n\r\n0123456789-+ \"'\\xabPINGECHO\x00\xff\t"


def random_input(rng: random.Random) -> bytes:
    n = rng.randrange(0, 80)
    if rng.random() < 0.5:
        return bytes(rng.choice(ALPHABET) for _ in range(n))
    return rng.randbytes(n)


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:        # flip a byte
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:            # insert a protocol-ish byte
            b[i:i] = bytes([rng.choice(ALPHABET)])
        elif op == 2 and b:      # delete a byte
            del b[min(i, len(b) - 1)]
        elif op == 3:            # truncate
            del b[i:]
        elif op == 4:            # duplicate a slice
            j = rng.randrange(i, len(b) + 1)
            b[j:j] = b[i:j]
        else:                    # change a digit
            digits = [k for k, c in enumerate(b) if 48 <= c <= 57]
            if digits:
                b[rng.choice(digits)] = rng.choice(b"0123456789-")
    return bytes(b)


FUZZ_LIMITS = [
    {},
    {"unauthenticated": True},
    {"max_bulk_len": 8, "max_multibulk_len": 4},
]


def fuzz_inputs():
    rng = random.Random(20240607)
    frames = VALID_FRAMES + [b"".join(rng.sample(VALID_FRAMES, 4)) for _ in range(20)]
    inputs = [random_input(rng) for _ in range(3000)]
    inputs += [mutate(rng, rng.choice(frames)) for _ in range(3000)]
    return rng, inputs


@pytest.mark.untraced
def test_random_and_mutated_input_never_crashes_and_is_consistent():
    rng, inputs = fuzz_inputs()
    errors = commands_seen = 0
    crashes = []
    for data in inputs:
        for kwargs in FUZZ_LIMITS:
            try:
                result = parse(data, **kwargs)
            except Exception as e:  # collected, so the other properties still run
                crashes.append((data, kwargs, repr(e)))
                continue
            check_result_shape(result, data)
            commands, used, err = result
            errors += err is not None
            commands_seen += len(commands)
            # the commands found are exactly those in the bytes consumed
            assert parse(data[:used], **kwargs) == (commands, used, None), data
            # any chunking of the same bytes gives the same outcome
            sizes = [rng.randrange(1, 9) for _ in range(len(data))]
            try:
                got, got_err, rest = feed(split(data, sizes), **kwargs)
            except Exception as e:
                crashes.append((data, kwargs, repr(e)))
                continue
            assert (got, got_err) == (commands, err), data
            if err is None:
                assert rest == data[used:], data
            streamed, stream_err, stream_rest, _ = parse_stream(split(data, sizes), **kwargs)
            assert (streamed, stream_err) == (commands, err), data
            if err is None:
                assert stream_rest == data[used:], data
    # the fuzzer really reached both outcomes
    assert errors > 1000 and commands_seen > 1000
    examples = [(d[:40], kw, e) for d, kw, e in crashes[:3]]
    assert not crashes, f"{len(crashes)} parses raised, e.g. {examples}"


@pytest.mark.parametrize("byte", [b"\x80", b"\x9d", b"\xff"])
def test_expected_dollar_error_naming_a_non_ascii_byte_is_a_str(byte):
    # the server sends the raw byte, as Redis does; parse() must still
    # return the error as text rather than raise UnicodeDecodeError
    commands, used, err = parse(b"*1\r\n" + byte + b"\r\n")
    assert (commands, used) == ([], 0)
    assert isinstance(err, str)
    assert err.startswith(PE + "expected '$', got '") and err.endswith("'")


HUGE = [
    ("bulk 999999999", b"*3\r\n$999999999\r\nab", {"max_bulk_len": 2**40}),
    ("bulk 512MB, default limit", b"*1\r\n$536870912\r\nabc", {}),
    ("bulk 2**40", b"*2\r\n$4\r\nECHO\r\n$1099511627776\r\n" + b"x" * 1000,
     {"max_bulk_len": 2**40}),
    ("bulk near INT64_MAX", b"*1\r\n$9223372036854775000\r\nxyz",
     {"max_bulk_len": 2**63 - 1}),
    ("2**31-1 args", b"*2147483647\r\n$1\r\na\r\n$1\r\nb\r\n",
     {"max_multibulk_len": 2**31 - 1}),
    ("1M args", b"*1048576\r\n" + b"$1\r\na\r\n" * 1000, {}),
]


@pytest.mark.untraced  # bounds time
@pytest.mark.parametrize("data, kwargs", [c[1:] for c in HUGE], ids=[c[0] for c in HUGE])
def test_huge_declared_lengths_are_just_incomplete(data, kwargs):
    start = time.perf_counter()
    for _ in range(100):
        assert parse(data, **kwargs) == ([], 0, None)
    # nothing sized by the declared length is allocated or touched
    assert time.perf_counter() - start < 1.0


# ---- one parser across reads (what a connection does) ---------------------------

def splits_of(data: bytes):
    for k in range(1, len(data)):
        yield [data[:k], data[k:]]
    for k in range(1, len(data) - 1):
        yield [data[:k], data[k:k + 1], data[k + 1:]]


SPLIT_FRAMES = VALID_FRAMES + [
    command(b"ECHO", b"x" * 300),
    command(*[b"%d" % i for i in range(40)]),       # argv grows while it arrives
    b"PING\r\nPING\r\n" + command(b"ECHO", b"a"),
]


@pytest.mark.parametrize("frame", SPLIT_FRAMES, ids=lambda f: repr(f[:24]))
def test_a_command_split_anywhere_parses_as_in_one_read(frame):
    whole = parse(frame)
    assert whole[2] is None
    for chunks in splits_of(frame):
        assert parse_stream(chunks)[:3] == (whole[0], None, frame[whole[1]:]), chunks


SPLIT_ERRORS = [(data, error, kwargs) for _, data, error, kwargs in ERRORS
                if len(data) < 200]


@pytest.mark.parametrize("data, error, kwargs", SPLIT_ERRORS, ids=repr)
def test_a_bad_frame_split_anywhere_gives_the_same_error(data, error, kwargs):
    assert parse(data, **kwargs) == ([], 0, error)
    for chunks in splits_of(data):
        commands, err, rest, _ = parse_stream(chunks, **kwargs)
        assert (commands, err) == ([], error), chunks


@pytest.mark.untraced
def test_pipelines_in_random_reads_parse_as_in_one_read():
    rng = random.Random(9)
    frames = SPLIT_FRAMES + [command(b"ECHO", b"y" * 70000), command(*[b"a"] * 3000)]
    for _ in range(300):
        data = b"".join(rng.choice(frames) for _ in range(rng.randrange(1, 12)))
        whole = parse(data)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(1, 40))))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        assert parse_stream(chunks)[:3] == (whole[0], None, b""), cuts


def test_a_partial_command_is_not_reparsed_from_the_start():
    # a bulk arriving a byte at a time is parsed once its last byte is
    # there (need covers the whole argument), not once per byte
    frame = command(b"ECHO", b"z" * 5000)
    commands, err, rest, calls = parse_stream([frame[i:i + 1] for i in range(len(frame))])
    assert (commands, err, rest) == ([[b"ECHO", b"z" * 5000]], None, b"")
    header = len(b"*2\r\n$4\r\nECHO\r\n$5000\r\n")
    assert calls <= header + 1
