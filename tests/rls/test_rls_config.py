"""Loading envoyproxy/ratelimit's YAML: every shape the reference refuses,
with its words, and what it accepts (config_impl.go)."""

from __future__ import annotations

import os

import pytest
from rls_tables import alias_bomb, plain

from fastlimit.rls.config import ConfigError, load, load_text
from fastlimit.rls.matcher import find_limit


def one(text: str):
    return load_text("c.yaml", text)


@pytest.mark.parametrize("text, problem", [
    ("domain: d\nfoo: 1\n", "config error, unknown key 'foo'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1,"
     " bogus: 2}\n", "config error, unknown key 'bogus'"),
    ("domain: d\ndescriptors:\n  - 5\n",
     "config error, yaml file contains list of type other than map: 5"),
    ("domain: d\n1: x\n", "config error, key is not of type string: 1"),
    ("domain: d\ndescriptors:\n  - key: a\n    value: 1.5\n", "error checking config"),
    ("descriptors: []\n", "config file cannot have empty domain"),
    ('domain: ""\n', "config file cannot have empty domain"),
    ("domain: d\ndescriptors:\n  - value: x\n", "descriptor has empty key"),
    ("domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n",
     "duplicate descriptor composite key 'd.a_b'"),
    ("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
     "duplicate descriptor composite key 'd.a.b'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, "
     "requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n",
     "invalid rate limit unit ''"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, "
     "requests_per_unit: 1}\n", "invalid rate limit unit 'unknown'"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
     "should not specify rate limit unit when unlimited"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1,"
     " replaces: [{name: ''}]}\n", "should not have an empty replaces entry"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: x, unit: second, "
     "requests_per_unit: 1, replaces: [{name: x}]}\n",
     "replaces should not contain name of same descriptor"),
    ("domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
     "share_threshold can only be used with wildcard values (containing '*'), "
     "but found key 'a_b'"),
])
def test_rejected_shapes_name_the_file_and_the_reference_s_problem(text, problem):
    with pytest.raises(ConfigError) as e:
        one(text)
    assert str(e.value) == f"c.yaml: {problem}"


def test_bad_yaml_is_an_error_loading_the_config_file():
    with pytest.raises(ConfigError, match=r"^c.yaml: error loading config file: yaml: "):
        one("domain: d\ndescriptors: [\n")


def test_a_value_of_the_wrong_type_is_an_error_loading_the_config_file():
    with pytest.raises(ConfigError, match=r"^c.yaml: error loading config file: .*uint32"):
        one("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, "
            "requests_per_unit: -1}\n")


@pytest.mark.parametrize("unit, enum", [("second", 1), ("SECOND", 1), ("Minute", 2),
                                        ("hour", 3), ("DAY", 4), ("month", 5), ("year", 6),
                                        ("Week", 7)])
def test_units_are_case_insensitive_from_second_to_year(unit, enum):
    d = one(f"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: {unit}, "
            f"requests_per_unit: 3}}\n")
    (limit,) = find_limit(d.root, [(b"a", b"x")])[0].limits
    assert (limit.requests_per_unit, limit.unit) == (3, enum)


def test_the_keys_beyond_the_reference_are_accepted():
    d = one("domain: d\ncounting: atomic\ndescriptors:\n  - key: a\n    rate_limits:\n"
            "      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n"
            "      - {unit: minute, requests_per_unit: 100, algorithm: gcra, "
            "unit_multiplier: 5}\n")
    assert d.counting == "atomic"
    limits = find_limit(d.root, [(b"a", b"x")])[0].limits
    assert [(lim.algorithm, lim.window_s) for lim in limits] == [("token_bucket", 1),
                                                                 ("gcra", 300)]


def a_minute(limit: str) -> str:
    """A file of one descriptor with a per-minute limit of these fields."""
    return f"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: minute, {limit}}}\n"


@pytest.mark.parametrize("text, problem", [
    ("domain: d\ncounting: sometimes\n", "invalid counting 'sometimes' (reference or atomic)"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1,"
     " algorithm: leaky}\n",
     "invalid algorithm 'leaky' (one of fixed_window, token_bucket, gcra, sliding_window)"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1,"
     " unit_multiplier: 0}\n", "unit_multiplier must be at least 1"),
    ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1,"
     " algorithm: gcra, unit_multiplier: 60}\n",
     "a window of 5184000 s is longer than the 4294967 s of the gcra algorithm"),
    (a_minute("requests_per_unit: 10, split: 2"), "split needs algorithm token_bucket, gcra "
     "or sliding_window (a fixed_window counter is counted whole)"),
    (a_minute("requests_per_unit: 10, algorithm: gcra, split: 65"),
     "split must be from 1 to 64"),
    (a_minute("requests_per_unit: 3, algorithm: gcra, split: 4"),
     "split 4 is more than requests_per_unit 3: every sub-bucket needs a token"),
    (a_minute("requests_per_unit: 100, algorithm: token_bucket, split: 64, "
              "unit_multiplier: 2000"),
     "split 64 makes a sub-bucket's window of 120000 s x 64 longer than the 4294967 s of "
     "the engine"),
])
def test_the_extra_keys_have_their_own_errors(text, problem):
    with pytest.raises(ConfigError) as e:
        one(text)
    assert str(e.value) == f"c.yaml: {problem}"


def test_a_directory_loads_every_yaml_file_and_skips_dotfiles_and_data_entries(tmp_path):
    (tmp_path / "a.yaml").write_text("domain: a\n")
    (tmp_path / "b.yaml").write_text("domain: b\n")
    (tmp_path / ".hidden.yaml").write_text("domain: a\n")      # would be a duplicate
    (tmp_path / "notes.txt").write_text("not: yaml: at all: [")
    data = tmp_path / "..2026_01_01"
    data.mkdir()
    (data / "c.yaml").write_text("domain: c\n")
    os.symlink(data.name, tmp_path / "..data")
    os.symlink("..data/c.yaml", tmp_path / "c.yaml")           # as a ConfigMap mounts it
    config = load(str(tmp_path))
    assert sorted(config.domains) == [b"a", b"b", b"c"]


def test_a_duplicate_domain_across_files_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("domain: same\n")
    (tmp_path / "b.yaml").write_text("domain: same\n")
    with pytest.raises(ConfigError) as e:
        load(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'b.yaml'}: duplicate domain 'same' in config file"


def test_a_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load(str(tmp_path / "nope.yaml"))


def test_a_childless_limitless_descriptor_is_whitelisted():
    d = one("domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n"
            "    rate_limit: {unit: second, requests_per_unit: 1}\n")
    assert find_limit(d.root, [(b"a", b"b")]) == (None, None)


def test_a_file_nested_too_deeply_is_an_error_not_a_crash():
    text = "domain: d\ndescriptors:\n" + "".join(
        "  " * (2 * i) + "  - key: k\n" + "  " * (2 * i) + "    descriptors:\n"
        for i in range(600))
    with pytest.raises(ConfigError, match="^c.yaml: error loading config file: "):
        one(text)


def test_a_date_like_value_is_a_string_as_go_yaml_reads_it():
    d = one("domain: d\ndescriptors:\n  - key: day\n    value: 2026-12-01\n"
            "    rate_limit: {unit: second, requests_per_unit: 1}\n")
    assert find_limit(d.root, [(b"day", b"2026-12-01")])[0] is not None


# ---- bounded work: aliases, descriptors, bytes -------------------------------------------

@pytest.mark.parametrize("levels", [4, 6])
def test_an_alias_bomb_is_refused_as_go_yaml_refuses_it(levels):
    text = alias_bomb(10, levels)
    assert len(text) < 3000
    with pytest.raises(ConfigError) as e:
        one(text)
    assert str(e.value) == ("c.yaml: error loading config file: yaml: document contains "
                            "excessive aliasing")


def test_aliases_that_expand_little_are_accepted_as_go_yaml_accepts_them():
    d = one(alias_bomb(10, 3))         # 1.4 KB, expanded: under go-yaml's ratio
    # the anchors, then each level's 10 keys over the level below, expanded
    assert (d.descriptors, d.limits) == (4 + 1 + (10 + 10) + (10 + 200) + (10 + 2100), 1111)
    shared = ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: &lim {unit: second, "
              "requests_per_unit: 3}\n  - key: b\n    rate_limit: *lim\n")
    assert find_limit(one(shared).root, [(b"b", b"x")])[0].limits[0].requests_per_unit == 3


def test_an_anchor_used_inside_itself_is_go_yamls_error_not_a_recursion():
    with pytest.raises(ConfigError) as e:
        one("domain: d\ndescriptors: &x\n  - key: a\n    descriptors: *x\n")
    assert str(e.value) == ("c.yaml: error loading config file: yaml: anchor 'x' value "
                            "contains itself")


def test_more_descriptors_than_rls_max_descriptors_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(plain(3, "a"))
    (tmp_path / "b.yaml").write_text(plain(3, "b"))
    assert load(str(tmp_path), max_descriptors=6).descriptor_count == 6
    with pytest.raises(ConfigError) as e:
        load(str(tmp_path), max_descriptors=5)
    assert str(e.value) == (f"{tmp_path / 'b.yaml'}: the configuration has more than 5 "
                            "descriptors (rls-max-descriptors)")


def test_aliases_under_go_yamls_ratio_still_count_every_descriptor(tmp_path):
    (tmp_path / "a.yaml").write_text(alias_bomb(10, 3))
    with pytest.raises(ConfigError, match="more than 1000 descriptors"):
        load(str(tmp_path), max_descriptors=1000)


def test_a_configuration_larger_than_rls_max_config_bytes_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(plain(10, "a"))
    (tmp_path / "b.yaml").write_text(plain(10, "b"))
    size = sum(len(p.read_bytes()) for p in tmp_path.iterdir())
    assert load(str(tmp_path), max_bytes=size).text_bytes == size
    with pytest.raises(ConfigError) as e:
        load(str(tmp_path), max_bytes=size - 1)
    assert str(e.value) == (f"{tmp_path / 'b.yaml'}: the configuration (its files together) "
                            f"is more than the {size - 1} bytes of rls-max-config-bytes")

