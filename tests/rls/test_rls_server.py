"""rls-config in a real server: loaded at start, reloaded on a write, on a
ConfigMap's symlink swap, on SIGHUP and on CL.RULE RELOAD; a bad file
keeps the configuration in force; CL.RLS from redis-cli's side."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

import pytest
import redis
from rls_tables import alias_bomb, plain
from servers import ExtraPortServer, ServerProcess, started_servers
from wire import longest_ping_while

from fastlimit.rls.config import load

ONE = """domain: one
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
TWO = """domain: two
descriptors:
  - key: user
    value: vip
    rate_limit: {name: vip, unit: hour, requests_per_unit: 1000}
"""


def info(client) -> dict:
    return client.info("rls")


def wait_for(predicate, what: str, timeout: float = 10.0):
    """Real time is the point here: the server polls the files once a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rewrite(path, text: str) -> None:
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_the_configuration_is_listed_and_a_descriptor_described(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(ONE)
    c = make_server("--rls-config", str(f), "--manual-clock").client()
    assert c.execute_command("CL.RLS", "LIST") == [
        b"one.user: unit=MINUTE requests_per_unit=5, algorithm: fixed_window, window_s: 60, "
        b"shadow_mode: false, quota_mode: false"]
    assert c.execute_command("CL.RLS", "DESCRIBE", "one", "user=alice") == \
        [b"OK", [5, b"MINUTE", b""], 5, 60]
    assert c.execute_command("CL.RLS", "DESCRIBE", "one", "other=x") == [b"OK", None, 0, 0]
    assert c.execute_command("CL.RLS", "DESCRIBE", "nope", "user=alice") == [b"OK", None, 0, 0]
    with pytest.raises(redis.ResponseError, match="descriptor entries are <key>=<value>"):
        c.execute_command("CL.RLS", "DESCRIBE", "one", "user")
    with pytest.raises(redis.ResponseError, match="rate limit domain must not be empty"):
        c.execute_command("CL.RLS", "DESCRIBE", "", "user=alice")
    fields = info(c)
    assert (fields["rls_domains"], fields["rls_descriptors"], fields["rls_limits"],
            fields["rls_last_reload_status"]) == (1, 1, 1, "ok")


def test_a_bad_configuration_stops_the_start_with_the_error(tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text("domain: d\nbogus: 1\n")
    s = ServerProcess("--rls-config", str(f))
    with pytest.raises(RuntimeError) as e:
        s.start()
    s.stop()
    assert f"cannot start: {f}: config error, unknown key 'bogus'" in str(e.value)


def test_a_written_file_is_reloaded_and_a_bad_one_keeps_the_old(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(ONE)
    s = make_server("--rls-config", str(f))
    c = s.client()
    rewrite(f, TWO)
    wait_for(lambda: c.execute_command("CL.RLS", "LIST", "two"), "the new domain")
    assert c.execute_command("CL.RLS", "LIST", "one") == []
    rewrite(f, "domain: two\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon}\n")
    fields = wait_for(lambda: (i := info(c))["rls_last_reload_status"] == "failed" and i,
                      "the failed reload")
    assert fields["rls_last_error"] == f"{f}: invalid rate limit unit 'eon'"
    assert fields["rls_domains"] == 1
    assert c.execute_command("CL.RLS", "DESCRIBE", "two", "user=vip")[1] == \
        [1000, b"HOUR", b"vip"]
    assert "invalid rate limit unit 'eon'" in s.log()


def test_a_configmap_symlink_swap_is_reloaded(make_server, tmp_path):
    def version(name: str, text: str):
        d = tmp_path / name
        d.mkdir()
        (d / "config.yaml").write_text(text)
        return d

    version("..v1", ONE)
    os.symlink("..v1", tmp_path / "..data")
    os.symlink("..data/config.yaml", tmp_path / "config.yaml")
    c = make_server("--rls-config", str(tmp_path)).client()
    assert c.execute_command("CL.RLS", "LIST", "one")
    version("..v2", TWO)
    os.symlink("..v2", tmp_path / "..data_tmp")
    os.rename(tmp_path / "..data_tmp", tmp_path / "..data")     # kubelet's atomic swap
    wait_for(lambda: c.execute_command("CL.RLS", "LIST", "two"), "the swapped config")
    assert info(c)["rls_domains"] == 1


def test_cl_rule_reload_and_sighup_reload_and_say_why_not(make_server, tmp_path):
    d = tmp_path / "conf"
    d.mkdir()
    (d / "one.yaml").write_text(ONE)
    s = make_server("--rls-config", str(d))
    c = s.client()
    (d / "two.yaml").write_text(TWO)
    assert c.execute_command("CL.RULE", "RELOAD") == b"OK"
    assert info(c)["rls_domains"] == 2
    (d / "three.yaml").write_text("domain: one\n")
    with pytest.raises(redis.ResponseError,
                       match=f"{d / 'three.yaml'}: duplicate domain 'one' in config file"):
        c.execute_command("CL.RULE", "RELOAD")
    assert info(c)["rls_domains"] == 2
    os.remove(d / "three.yaml")
    os.remove(d / "two.yaml")
    reloads = info(c)["rls_reloads"]
    s.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: info(c)["rls_reloads"] > reloads and info(c)["rls_domains"] == 1,
             "the SIGHUP reload")


def test_response_headers_can_be_turned_on_at_runtime(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(ONE)
    c = make_server("--rls-config", str(f)).client()
    assert c.config_get("rls-*") == {"rls-config": str(f), "rls-response-headers": "no",
                                     "rls-shadow-mode": "no", "rls-merge-domains": "no",
                                     "rls-max-config-bytes": "4194304",
                                     "rls-max-descriptors": "100000",
                                     "rls-xds-server": "", "rls-xds-node-id": "default",
                                     "rls-xds-backoff": "10 60", "rls-xds-tls": "no"}
    assert c.config_set("rls-response-headers", "yes")
    assert c.config_get("rls-response-headers") == {"rls-response-headers": "yes"}
    with pytest.raises(redis.ResponseError):
        c.config_set("rls-config", str(f))          # a restart's setting


# ---- bounded work: aliases, bounds, a thread for the reading, one step for the swap ------------

def test_an_alias_bomb_is_refused_and_the_configuration_in_force_keeps_serving(make_server,
                                                                                tmp_path):
    d = tmp_path / "rls"
    d.mkdir()
    (d / "a.yaml").write_text(ONE)
    s = make_server("--rls-config", str(d), "--manual-clock")
    c = s.client()
    (d / "b.yaml").write_text(alias_bomb(10, 6))     # 2 KB for a million descriptors
    fields = wait_for(lambda: (i := info(c))["rls_last_reload_status"] == "failed" and i,
                      "the refused reload")
    assert fields["rls_last_error"] == (f"{d / 'b.yaml'}: error loading config file: yaml: "
                                        "document contains excessive aliasing")
    assert (fields["rls_domains"], fields["rls_descriptors"]) == (1, 1)
    assert c.execute_command("CL.RLS", "DESCRIBE", "one", "user=alice") == \
        [b"OK", [5, b"MINUTE", b""], 5, 60]
    assert "excessive aliasing" in s.log()


def test_a_configuration_over_its_bounds_is_refused_and_says_which(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(plain(2))
    s = make_server("--rls-config", str(f), "--rls-max-descriptors", "2")
    c = s.client()
    assert (info(c)["rls_max_descriptors"], c.info("memory")["rls_max_config_bytes"]) == (
        2, 4 * 1024**2)
    rewrite(f, plain(3))
    fields = wait_for(lambda: (i := info(c))["rls_last_reload_status"] == "failed" and i,
                      "the refused reload")
    assert fields["rls_last_error"] == (f"{f}: the configuration has more than 2 descriptors "
                                        "(rls-max-descriptors)")
    assert fields["rls_descriptors"] == 2
    assert c.config_set("rls-max-descriptors", "3")
    assert c.execute_command("CL.RULE", "RELOAD") == b"OK"
    assert info(c)["rls_descriptors"] == 3
    assert c.config_set("rls-max-config-bytes", "1kb")
    f.write_text(plain(30))
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("CL.RULE", "RELOAD")
    assert str(e.value) == (f"{f}: the configuration (its files together) is more than the "
                            "1024 bytes of rls-max-config-bytes")
    assert info(c)["rls_descriptors"] == 3


@pytest.mark.untraced
def test_the_server_answers_while_a_large_configuration_is_read(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(ONE)
    s = make_server("--rls-config", str(f))
    c = s.client()
    big = tmp_path / "big.yaml"
    big.write_text(plain(20_000, "big"))     # 1.3 MB, a third of rls-max-config-bytes
    began = time.perf_counter()
    load(str(big))
    reading = time.perf_counter() - began    # what the loop would have stalled for
    assert reading > 0.4
    longest = longest_ping_while(s.port, lambda: os.replace(big, f),
                                 lambda: info(c)["rls_descriptors"] == 20_000,
                                 "the large configuration", 120)
    assert longest < reading / 4, (longest, reading)


class HttpServer(ExtraPortServer):
    PORT_FLAG = "--http-port"


@pytest.mark.untraced
def test_a_reload_puts_the_new_configuration_in_force_in_one_step(tmp_path):
    """Two descriptors of one call always come from one configuration,
    while reloads swap configurations whose limits all differ."""
    f = tmp_path / "rls.yaml"
    f.write_text(plain(2000, "d", rpu=1))
    call = json.dumps({"domain": "d", "descriptors": [
        {"entries": [{"key": "k0", "value": "x"}]},
        {"entries": [{"key": "k1999", "value": "x"}]}], "hitsAddend": 0}).encode()
    seen: list = []
    stopped = threading.Event()
    with started_servers(HttpServer) as make:
        s = make("--rls-config", str(f))
        c = s.client()

        def check_continuously() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", s.extra_port, timeout=30)
            while not stopped.is_set():
                conn.request("POST", "/json", body=call)
                doc = json.loads(conn.getresponse().read())
                seen.append(tuple(st["currentLimit"]["requestsPerUnit"]
                                  for st in doc["statuses"]))

        checker = threading.Thread(target=check_continuously, daemon=True)
        checker.start()
        for n in range(6):
            reloads = info(c)["rls_reloads"]
            rewrite(f, plain(2000, "d", rpu=2 + n % 2))
            wait_for(lambda before=reloads: info(c)["rls_reloads"] > before, "the reload", 60)
        stopped.set()
        checker.join(30)
    assert set(seen) == {(1, 1), (2, 2), (3, 3)}
