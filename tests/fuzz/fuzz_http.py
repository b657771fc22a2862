"""HTTP/1.1 requests through the HTTP front's connection (_http.pyx's
HttpConnection on httptools, its check endpoints and the routed pages) on
a server in this process, in reads cut anywhere.  A route's bug is logged
with its traceback and answered 500: that counts as a finding here."""

import sys

import harness

with harness.instrumented():
    from fastlimit._http import HttpConnection
    from fastlimit.server.app import Server  # noqa: F401  (instrumented with the routes)

SERVER = harness.server()


def one_input(data: bytes) -> None:
    harness.feed(HttpConnection(SERVER.http.shared), harness.split(data))
    harness.raise_logged_bugs()
    harness.reset(SERVER)


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
