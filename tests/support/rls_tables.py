"""The configurations and descriptors of the golden vectors (notes §2.7:
envoyproxy/ratelimit's README Examples 2, 3 and 7) and of the edge cases
of its test/config/basic_config.yaml, typed again as our fixtures: the
decision's tests (test_rls_service.py) and /json's (test_rls_json.py)
run the same tables."""

import os
import sys

SECOND, MINUTE, HOUR, DAY = 1, 2, 3, 4

# A Thursday, at the start of a UTC day: every window from a second to a
# week starts here (weeks start on Thursday, aligned to the Unix epoch).
T0_MS = 1_767_830_400_000


def lim(rpu, unit, name=b""):
    """A status's current_limit as the service gives it."""
    return (rpu, unit, name)


MESSAGING = """
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
"""

EDGE_PER_IP = """
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
"""

EXAMPLE7 = """
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {replaces: [{name: specific_limit}], requests_per_unit: 10, unit: second}
"""

BASIC = """
domain: test-domain
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: subkey
        rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: user
    value: user-a
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 1}
"""

D1 = [("message_type", "marketing"), ("to_number", "2061111111")]
D2 = [("to_number", "2061111111")]

# basic_config.yaml's matching: (entries, the current_limit they get)
BASIC_MATCHES = [
    ([("key2", "value3")], None),                                  # whitelisted, no fallback
    ([("key2", "other")], lim(20, MINUTE)),                        # key only
    ([("key2", "value2")], lim(30, MINUTE)),                       # exact value first
    ([("key2", "value2"), ("subkey", "x")], None),                 # value2 has no children
    ([("key2", "x"), ("subkey", "x")], lim(30, MINUTE)),           # limit at the last entry
    ([("key5", "value5")], lim(15, DAY)),
    ([("key5", "value5"), ("subkey5", "subvalue5")], lim(25, DAY)),
    ([("key5", "value5"), ("subkey5", "other")], None),            # no backtracking
    ([("key5", "value5"), ("subkey5", "subvalue5"), ("x", "y")], None),
    ([("midWild", "barXb")], lim(1, MINUTE)),
    ([("midWild", "barX")], None),
    ([("multiWild", "fooAbarBbaz")], lim(1, MINUTE)),
    ([("multiWild", "foobarbaz")], lim(1, MINUTE)),
    ([("multiWild", "foobaz")], None),
    ([("nothing", "here")], None),
]


# ---- bounded work: documents made to be large -------------------------------------------

# alias_bomb(width, levels): the second review's file, as the soak sends it
# (each level's anchor used width times by the next: a 2 KB file (10, 6)
# stands for a million descriptors).  bench/ is not a package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench"))
from soak import alias_bomb  # noqa: E402,F401


def plain(count: int, domain: str = "d", rpu: int = 1) -> str:
    """A domain of count descriptors, each with a limit of rpu a second."""
    return f"domain: {domain}\ndescriptors:\n" + "".join(
        f"  - key: k{i}\n    rate_limit: {{unit: second, requests_per_unit: {rpu}}}\n"
        for i in range(count))
