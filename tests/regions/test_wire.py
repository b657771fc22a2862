"""The batch of spends that crosses regions (fastlimit.regions.wire):
round trips, cutting into bounded batches, and every malformed batch
refused with WireError, never another exception (fuzzed)."""

from __future__ import annotations

import random

import pytest

from fastlimit.regions.wire import WireError, decode_batch, encode_batches

IDS = {1: "api", 2: "login", 7: "é"}


def test_a_round_trip_names_rules_by_id():
    spends = {(1, b"alice"): 3, (2, b"bob"): 1, (7, b"\x00k"): 9, (9, b"gone"): 4}
    (batch,) = encode_batches(spends, IDS)
    assert decode_batch(batch) == [("api", b"alice", 3), ("login", b"bob", 1),
                                   ("é", b"\x00k", 9)]     # rule 9 was deleted: left out


def test_large_spends_are_cut_into_bounded_batches():
    spends = {(1, b"key%05d" % i): i + 1 for i in range(1000)}
    batches = list(encode_batches(spends, IDS, most=1000))
    assert all(len(b) <= 1000 for b in batches) and len(batches) > 10
    got = [entry for b in batches for entry in decode_batch(b)]
    assert got == [("api", key, cost) for (_, key), cost in spends.items()]
    assert list(encode_batches({}, IDS)) == []


@pytest.mark.parametrize("data", [
    b"", b"\x01\x00", b"\x01\x00\x05\x00ab", b"\x00\x00\x01\x00\x00\x00",
    # a spend of rule index 1 of 1 rule
    b"\x01\x00\x01\x00a\x01\x00\x00\x00\x01\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00k",
    # a cost of 0
    b"\x01\x00\x01\x00a\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00k",
    # bytes after the end
    b"\x00\x00\x00\x00\x00\x00x",
    # a rule id that is not UTF-8
    b"\x01\x00\x01\x00\xff\x00\x00\x00\x00",
])
def test_malformed_batches_are_refused(data):
    with pytest.raises(WireError):
        decode_batch(data)


def test_fuzzed_batches_raise_only_wire_error():
    rng = random.Random(7)
    (good,) = encode_batches({(1, b"alice"): 3, (2, b"bob"): 1}, IDS)
    for _ in range(5000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            decode_batch(data)
        except WireError:
            pass


def test_a_key_too_long_for_any_batch_is_left_out():
    spends = {(1, b"k" * 70_000): 1, (1, b"ok"): 2}
    (batch,) = encode_batches(spends, IDS)
    assert decode_batch(batch) == [("api", b"ok", 2)]
