"""A standalone server's start imports only what it uses: the suite starts
servers by the thousand, and redis-py alone was a third of each start."""

import os
import subprocess
import sys

import pytest

# Imported by parts a standalone server with no rls-config (or
# rls-xds-server, for grpc) never runs.
UNUSED_AT_START = ("redis", "redis.client", "fastlimit.client", "yaml", "email.utils", "grpc")


def loaded_modules(code: str) -> set[str]:
    python = os.environ.get("FASTLIMIT_PYTHON", sys.executable)
    out = subprocess.run([python, "-c", code + "\nimport sys\n"
                          "print('\\n'.join(n for n, m in sys.modules.items()"
                          " if type(m).__name__ != '_LazyModule'))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_a_standalone_server_imports_no_redis_py_yaml_or_email_at_start():
    loaded = loaded_modules("import fastlimit.server.main, fastlimit.server.app")
    assert not loaded & set(UNUSED_AT_START)


def test_the_public_names_still_import_on_first_use():
    loaded = loaded_modules("from fastlimit import Client, Limiter, BucketStore")
    assert "fastlimit.client" in loaded and "redis.client" in loaded


@pytest.mark.parametrize("name", ["Client", "AsyncClient", "Limiter", "LocalFallback",
                                  "BucketStore", "Clock", "CircuitBreaker", "Decision"])
def test_every_public_name_resolves(name):
    import fastlimit
    assert getattr(fastlimit, name).__name__ == name
