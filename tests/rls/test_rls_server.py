"""rls-config in a real server: loaded at start, reloaded on a write, on a
ConfigMap's symlink swap, on SIGHUP and on CL.RULE RELOAD; a bad file
keeps the configuration in force; CL.RLS from redis-cli's side."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from servers import ServerProcess

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
                                     "rls-xds-server": "", "rls-xds-node-id": "default",
                                     "rls-xds-backoff": "10 60", "rls-xds-tls": "no"}
    assert c.config_set("rls-response-headers", "yes")
    assert c.config_get("rls-response-headers") == {"rls-response-headers": "yes"}
    with pytest.raises(redis.ResponseError):
        c.config_set("rls-config", str(f))          # a restart's setting
