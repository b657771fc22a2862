"""envoyproxy/ratelimit's YAML configuration (rls/config.py on PyYAML):
one file, or several (cut at "\\n---8<---\\n") loaded together, with
domains merged when the first byte is odd.  ConfigError is the one clear
error."""

import sys

import harness

with harness.instrumented():
    from fastlimit.rls import config as rls_config
    from fastlimit.rls import goyaml  # noqa: F401  (instrumented)

CUT = "\n---8<---\n"


def one_input(data: bytes) -> None:
    merge = bool(data) and data[0] & 1 == 1
    try:
        texts = data[1:].decode("utf-8").split(CUT)
    except UnicodeDecodeError:
        return      # the file reader refuses it before parsing, with ConfigError
    with harness.expect(rls_config.ConfigError):
        domains: dict = {}
        for n, text in enumerate(texts):
            domain = rls_config.load_text(f"config{n}.yaml", text, domains, merge)
            domains[domain.name] = domain
        config = rls_config.RlsConfig(domains, tuple(domains), len(data))
        if config.limit_count < 0 or config.descriptor_count < 0:
            raise harness.Finding(f"negative counts in {config!r}")


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
