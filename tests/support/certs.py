"""Test certificates, made at test time with trustme (never checked in):
ECDSA P-256, SAN localhost and 127.0.0.1 (Python's host name check needs
the IP in the SAN)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import trustme

HOSTS = ("localhost", "127.0.0.1")
# trustme's default not_before is "now"; an expired certificate's dates
# are both in the past.
LONG_AGO = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
EXPIRED_AT = datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC)


@dataclass
class Pair:
    cert: str
    key: str


@dataclass
class Certs:
    ca: str             # the CA the server trusts and the clients trust
    other_ca: str       # a CA nobody here trusts: its certificates are refused
    server: Pair
    renewed: Pair       # another server certificate from the same CA
    client: Pair
    expired_client: Pair
    expired_server: Pair
    stranger_client: Pair   # a client certificate from other_ca
    dir: str


def _write(dir: str, name: str, issued: trustme.LeafCert) -> Pair:
    pair = Pair(os.path.join(dir, f"{name}.crt"), os.path.join(dir, f"{name}.key"))
    issued.cert_chain_pems[0].write_to_path(pair.cert)
    issued.private_key_pem.write_to_path(pair.key)
    return pair


def make_certs(dir: str) -> Certs:
    ca, other = trustme.CA(), trustme.CA()
    paths = {"ca": os.path.join(dir, "ca.pem"), "other_ca": os.path.join(dir, "other-ca.pem")}
    ca.cert_pem.write_to_path(paths["ca"])
    other.cert_pem.write_to_path(paths["other_ca"])
    expired = {"not_before": LONG_AGO, "not_after": EXPIRED_AT}
    return Certs(
        ca=paths["ca"], other_ca=paths["other_ca"],
        server=_write(dir, "server", ca.issue_cert(*HOSTS)),
        renewed=_write(dir, "renewed", ca.issue_cert(*HOSTS)),
        client=_write(dir, "client", ca.issue_cert("client1.example")),
        expired_client=_write(dir, "expired-client", ca.issue_cert("client2.example", **expired)),
        expired_server=_write(dir, "expired-server", ca.issue_cert(*HOSTS, **expired)),
        stranger_client=_write(dir, "stranger", other.issue_cert("client3.example")),
        dir=dir)
