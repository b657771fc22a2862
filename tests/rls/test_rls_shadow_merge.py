"""rls-shadow-mode (the reference's global SHADOW_MODE) and
rls-merge-domains (MERGE_DOMAIN_CONFIG): the decision in-process, the
loader on real files, and both settings on real servers."""

from __future__ import annotations

import pytest
import redis
from rls_tables import EDGE_PER_IP, SECOND, lim
from servers import ServerProcess

from fastlimit.rls.config import ConfigError, load
from fastlimit.rls.matcher import find_limit
from fastlimit.rls.service import OK, OVER_LIMIT

BLOCKED = [("remote_address", "50.0.0.5")]      # requests_per_unit 0

# ---- global shadow mode ---------------------------------------------------------------


def test_global_shadow_mode_answers_ok_and_leaves_the_statuses_over(rig):
    r = rig(EDGE_PER_IP)
    r.service.shadow_mode = True
    assert r.call("edge_proxy_per_ip", BLOCKED) == (
        OK, [(OVER_LIMIT, lim(0, SECOND), 0, 1)], [])
    assert r.call("edge_proxy_per_ip", [("remote_address", "1.1.1.1")])[0] == OK
    stats = r.service.stats[b"edge_proxy_per_ip"]
    assert (r.service.global_shadow_mode, stats.over_limit, stats.limits_over) == (1, 0, 1)
    r.service.shadow_mode = False
    assert r.call("edge_proxy_per_ip", BLOCKED)[0] == OVER_LIMIT


ATOMIC = """
domain: a
counting: atomic
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
"""


def test_global_shadow_mode_spends_nothing_that_atomic_counting_would_not(rig):
    r = rig(ATOMIC)
    r.service.shadow_mode = True
    overall, statuses, _ = r.call("a", [("user", "u")], [("blocked", "x")])
    assert (overall, statuses[0][0], statuses[1][0]) == (OK, OK, OVER_LIMIT)
    # the user's two were not spent by the request that would have been refused
    assert [r.call("a", [("user", "u")])[0] for _ in range(2)] == [OK, OK]
    assert r.call("a", [("user", "u")])[1][0][0] == OVER_LIMIT


def test_global_shadow_mode_is_a_setting_off_by_default_and_in_info(make_server, tmp_path):
    f = tmp_path / "rls.yaml"
    f.write_text(EDGE_PER_IP)
    c = make_server("--rls-config", str(f), "--manual-clock").client()
    assert c.config_get("rls-shadow-mode") == {"rls-shadow-mode": "no"}
    assert c.info("rls")["rls_global_shadow_mode"] == 0
    c.config_set("rls-shadow-mode", "yes")
    assert c.config_get("rls-shadow-mode") == {"rls-shadow-mode": "yes"}
    c2 = make_server("--rls-config", str(f), "--rls-shadow-mode", "yes").client()
    assert c2.config_get("rls-shadow-mode") == {"rls-shadow-mode": "yes"}
    with pytest.raises(redis.ResponseError, match="rls-shadow-mode"):
        c.config_set("rls-shadow-mode", "maybe")


# ---- merging domains: the loader ------------------------------------------------------

A = """domain: d
descriptors:
  - key: x
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: w
    value: "a*"
    rate_limit: {unit: minute, requests_per_unit: 2}
"""
B = """domain: d
descriptors:
  - key: y
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: w
    value: "ab*"
    rate_limit: {unit: minute, requests_per_unit: 4}
"""
OTHER = """domain: e
descriptors:
  - key: x
    rate_limit: {unit: second, requests_per_unit: 5}
"""


def config_dir(tmp_path, **files):
    d = tmp_path / "config"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / f"{name}.yaml").write_text(text)
    return d


def limit_of(config, domain: bytes, *entries):
    node, _ = find_limit(config.domains[domain].root,
                         [(k.encode(), v.encode()) for k, v in entries])
    return None if node is None else node.limits[0].current_limit


def test_without_merging_a_second_file_of_a_domain_is_the_reference_error(tmp_path):
    d = config_dir(tmp_path, a=A, b=B)
    with pytest.raises(ConfigError, match=f"^{d / 'b.yaml'}: duplicate domain 'd' in config "
                                          f"file$"):
        load(str(d))


def test_the_duplicate_domain_is_found_before_the_file_s_other_errors(tmp_path):
    d = config_dir(tmp_path, a=A, b=B.replace("unit: hour", "unit: fortnight"))
    with pytest.raises(ConfigError, match="duplicate domain 'd'"):
        load(str(d))
    with pytest.raises(ConfigError, match="invalid rate limit unit 'fortnight'"):
        load(str(d), merge_domains=True)


def test_merged_files_of_a_domain_make_one_tree_wildcards_in_load_order(tmp_path):
    config = load(str(config_dir(tmp_path, a=A, b=B, c=OTHER)), merge_domains=True)
    assert sorted(config.domains) == [b"d", b"e"]
    assert limit_of(config, b"d", ("x", "1")) == (1, 2, b"")
    assert limit_of(config, b"d", ("y", "1")) == (3, 3, b"")
    assert limit_of(config, b"d", ("w", "abc")) == (2, 2, b"")      # a.yaml's a* first
    assert limit_of(config, b"e", ("x", "1")) == (5, 1, b"")
    assert (config.domains[b"d"].descriptors, config.domains[b"d"].limits) == (4, 4)
    assert config.descriptor_count == 5


def test_a_top_level_key_in_two_merged_files_is_a_duplicate_composite_key(tmp_path):
    d = config_dir(tmp_path, a=A, b=B.replace("key: y", "key: x"))
    with pytest.raises(ConfigError, match=f"^{d / 'b.yaml'}: duplicate descriptor composite "
                                          f"key 'd.x'$"):
        load(str(d), merge_domains=True)


def test_nested_keys_of_different_top_level_descriptors_merge(tmp_path):
    nested = "domain: d\ndescriptors:\n  - key: p\n    value: '{v}'\n    descriptors:\n" \
             "      - key: q\n        rate_limit: {{unit: day, requests_per_unit: {n}}}\n"
    config = load(str(config_dir(tmp_path, a=nested.format(v=1, n=6),
                                 b=nested.format(v=2, n=7))), merge_domains=True)
    assert limit_of(config, b"d", ("p", "1"), ("q", "z")) == (6, 4, b"")
    assert limit_of(config, b"d", ("p", "2"), ("q", "z")) == (7, 4, b"")


@pytest.mark.parametrize("first, second, counting", [
    ("atomic", None, "atomic"),
    (None, "atomic", "atomic"),
    ("atomic", "atomic", "atomic"),
    (None, None, "reference"),
])
def test_merged_files_share_the_counting_one_of_them_sets(tmp_path, first, second, counting):
    def text(base, c):
        return base if c is None else base.replace("domain: d\n", f"domain: d\ncounting: {c}\n")
    config = load(str(config_dir(tmp_path, a=text(A, first), b=text(B, second))),
                  merge_domains=True)
    assert config.domains[b"d"].counting == counting


def test_merged_files_that_disagree_on_counting_are_an_error(tmp_path):
    d = config_dir(tmp_path, a=A.replace("domain: d\n", "domain: d\ncounting: atomic\n"),
                   b=B.replace("domain: d\n", "domain: d\ncounting: reference\n"))
    with pytest.raises(ConfigError, match=f"{d / 'b.yaml'}: counting 'reference' of domain 'd' "
                                          f"differs from the 'atomic' of {d / 'a.yaml'}"):
        load(str(d), merge_domains=True)


# ---- merging domains: the setting -----------------------------------------------------

def describe(c, domain: str, entry: str):
    return c.execute_command("CL.RLS", "DESCRIBE", domain, entry)[1]


def test_a_server_without_merging_refuses_to_start_on_a_split_domain(tmp_path):
    d = config_dir(tmp_path, a=A, b=B)
    s = ServerProcess("--rls-config", str(d))
    with pytest.raises(RuntimeError) as e:
        s.start()
    s.stop()
    assert f"{d / 'b.yaml'}: duplicate domain 'd' in config file" in str(e.value)


def test_merging_at_start_and_config_set_back_is_refused_keeping_the_config(
        make_server, tmp_path):
    d = config_dir(tmp_path, a=A, b=B)
    c = make_server("--rls-config", str(d), "--rls-merge-domains", "yes").client()
    assert describe(c, "d", "x=1") == [1, b"MINUTE", b""]
    assert describe(c, "d", "y=1") == [3, b"HOUR", b""]
    with pytest.raises(redis.ResponseError, match="duplicate domain 'd' in config file"):
        c.config_set("rls-merge-domains", "no")
    assert c.config_get("rls-merge-domains") == {"rls-merge-domains": "yes"}
    assert describe(c, "d", "y=1") == [3, b"HOUR", b""]
    assert c.info("rls")["rls_domains"] == 1


def test_config_set_merging_reads_the_files_again_with_it(make_server, tmp_path):
    d = config_dir(tmp_path, a=A)
    c = make_server("--rls-config", str(d)).client()
    (d / "b.yaml").write_text(B)
    with pytest.raises(redis.ResponseError, match="duplicate domain 'd'"):
        c.execute_command("CL.RULE", "RELOAD")
    assert describe(c, "d", "y=1") is None
    c.config_set("rls-merge-domains", "yes")
    assert describe(c, "d", "y=1") == [3, b"HOUR", b""]
    assert c.info("rls")["rls_last_reload_status"] == "ok"
