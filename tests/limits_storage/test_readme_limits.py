"""The README's `limits`, slowapi and Flask-Limiter examples, run as
written against a real server (its port for the README's 6380): the plain
`limits` calls print what the README shows, the slowapi and Flask-Limiter
apps allow 50 a minute, and the failure options behave as the section
says with nothing listening."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys

import pytest
from readme import readme_python, shown_prints
from wire import free_port

HEADING = "## `limits`, slowapi and Flask-Limiter: fastlimit as their storage"


def blocks(port: int) -> list[str]:
    found = readme_python(HEADING)
    assert len(found) == 5, len(found)
    return [b.replace("127.0.0.1:6380", f"127.0.0.1:{port}") for b in found]


def run(tmp_path, *codes: str) -> tuple[dict, str]:
    """The blocks, one after the other, as one module file imported (as an
    app's module is): its namespace and what it printed."""
    path = tmp_path / f"readme_example_{len(list(tmp_path.iterdir()))}.py"
    path.write_text("\n".join(codes))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            spec.loader.exec_module(module)
    finally:
        del sys.modules[path.stem]
    return vars(module), out.getvalue()


def test_the_limits_example_prints_what_the_readme_shows(r, server, tmp_path):
    code = blocks(server.port)[0]
    _, out = run(tmp_path, code)
    assert out.splitlines() == shown_prints(code)
    assert r.info("memory")["windows_keys"] == 0         # its reset() forgot its keys


def test_the_slowapi_app_allows_50_a_minute(r, server, tmp_path):
    from starlette.testclient import TestClient

    app = run(tmp_path, blocks(server.port)[1])[0]["app"]
    with TestClient(app) as client:
        statuses = [client.get("/hello").status_code for _ in range(52)]
    assert statuses == [200] * 50 + [429] * 2
    assert r.info("memory")["windows_keys"] == 1


def test_the_flask_app_allows_50_a_minute(r, server, tmp_path):
    app = run(tmp_path, blocks(server.port)[2])[0]["app"]
    client = app.test_client()
    assert [client.get("/hello").status_code for _ in range(52)] == [200] * 50 + [429] * 2
    assert r.info("memory")["windows_keys"] == 1


def test_the_failure_options_with_nothing_listening(tmp_path):
    down = blocks(free_port())
    # Flask-Limiter with short timeouts and the in-memory fallback (the
    # README's Limiter in place of the Flask example's): the limit counted
    # in the process
    flask_app = re.sub(r"limiter = Limiter\(.*?\)\n", lambda _: down[3], down[2], count=1,
                       flags=re.DOTALL)
    assert flask_app != down[2] and "in_memory_fallback_enabled=True" in flask_app
    app = run(tmp_path, flask_app)[0]["app"]
    client = app.test_client()
    assert [client.get("/hello").status_code for _ in range(52)] == [200] * 50 + [429] * 2


@pytest.mark.parametrize("swallow", [False, True])
def test_slowapi_with_swallow_errors_and_the_readmes_middleware(swallow, tmp_path):
    from starlette.testclient import TestClient

    down = blocks(free_port())
    code = down[1]
    if swallow:
        code = code.replace('strategy="moving-window")', 'strategy="moving-window", '
                            'swallow_errors=True)')
    ns = run(tmp_path, code, down[4])[0]          # the app, then the README's middleware
    with TestClient(ns["app"], raise_server_exceptions=False) as client:
        status = client.get("/hello").status_code
    assert status == (200 if swallow else 500)

