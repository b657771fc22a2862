"""The workload of the gRPC benches (bench/grpc_front.py, bench/grpc_path.py):
envoyproxy/ratelimit's YAML as its users write it, and the two requests,
with the answer each must get.  The messages are made by
tests/support/rls_messages.py, written from rls.proto's field numbers
independently of the server's C code."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from rls_messages import MINUTE, OK, OVER_LIMIT, SECOND, descriptor, request  # noqa: E402

DAY = 4
NEVER = 1_000_000_000          # a requests_per_unit no run reaches
DOMAIN = b"bench"
RLS_YAML = f"""\
domain: bench
descriptors:
  # never reached: every call is OK
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: {NEVER}
  - key: generic_key
    value: per_path
    descriptors:
      - key: path
        rate_limit:
          unit: minute
          requests_per_unit: {NEVER}
  # one a day: the first call spends it, every later one is over
  - key: spent
    rate_limit:
      unit: day
      requests_per_unit: 1
"""

# bench/grpc_path.py's `big` tree: this many descriptors more in the domain
BIG_ENTRIES = 10_000


def big_tree(entries: int = BIG_ENTRIES) -> str:
    """entries descriptors more for RLS_YAML's domain: user=uN exact
    values at its root, and path wildcards /wN/* under generic_key=wild."""
    half = entries // 2
    exact = "".join(f"  - key: user\n    value: u{i}\n    rate_limit: {{unit: minute, "
                    f"requests_per_unit: {i + 1}}}\n" for i in range(half))
    wild = "".join(f"      - key: path\n        value: /w{i}/*\n        rate_limit: {{unit: "
                   f"second, requests_per_unit: {i + 1}}}\n" for i in range(half - 1))
    return exact + "  - key: generic_key\n    value: wild\n    descriptors:\n" + wild


@dataclass(frozen=True)
class Variant:
    descriptors: tuple          # each descriptor's entries: ((key, value), ...)
    statuses: tuple             # each status's expected (code, current_limit)
    overall: int

    @property
    def message(self) -> bytes:
        """The RateLimitRequest, as Envoy sends it (hits_addend unset)."""
        return request(DOMAIN, *(descriptor(list(entries)) for entries in self.descriptors))

    @property
    def arguments(self) -> tuple:
        """What the gRPC front hands RateLimitService.should_rate_limit."""
        return DOMAIN, [(list(entries), None, None) for entries in self.descriptors], 0


API_KEY = ((b"api_key", b"k1"),)
VARIANTS = {
    # two descriptors under limits never reached: every call OK
    "ok": Variant((API_KEY, ((b"generic_key", b"per_path"), (b"path", b"/demo"))),
                  ((OK, (NEVER, SECOND, b"")), (OK, (NEVER, MINUTE, b""))), OK),
    # one of those and one spent: every call OVER_LIMIT, half its statuses
    "over": Variant((API_KEY, ((b"spent", b"yes"),)),
                    ((OK, (NEVER, SECOND, b"")), (OVER_LIMIT, (1, DAY, b""))), OVER_LIMIT),
}
