"""envoyproxy/ratelimit's YAML configuration, loaded unchanged and checked
as the reference checks it (src/config/config_impl.go): the same accepted
keys, the same errors in the same words ("<file>: <problem>"), the same
tree.  A file, or a directory of *.yaml files with one domain each
(dotfiles and Kubernetes' ``..data`` entries skipped).

Beyond the reference, in the same YAML (keys the reference would refuse):

    algorithm: fixed_window|token_bucket|gcra|sliding_window   per limit
    unit_multiplier: N          the window is N units (default 1)
    split: k                    a hot descriptor's bucket as k sub-buckets (README
                                "Split keys"; not for fixed_window, counted whole)
    rate_limits: [{...}, ...]   several limits on one descriptor (beside or
                                instead of rate_limit)
    counting: reference|atomic  per domain, at the top of the file
    regions: regional|static|global|home   per limit, its scope among regions
                                (README "Regions"; static: each region an equal
                                share of requests_per_unit; global: every region's
                                hits counted in every region; home: counted in the
                                descriptor's home region only; not with split)
    home: <region>              a home limit's region for every descriptor (else
                                the hash of the descriptor's key picks it)

The loaded tree (Node) is what matcher.py walks: children by the
reference's composite key (``key`` or ``key_value``), wildcard children
in load order, each node's limits compiled once.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, replace

from fastlimit._rules import MAX_SPLIT
from fastlimit.regions.shares import REGION_NAME, Regions, share_count

# RateLimitResponse.RateLimit.Unit: name -> (enum, seconds) as
# utils.UnitToDivider has them (a month is 30 days, a year 365).
UNITS = {"SECOND": (1, 1), "MINUTE": (2, 60), "HOUR": (3, 3600), "DAY": (4, 86400),
         "MONTH": (5, 2592000), "YEAR": (6, 31536000), "WEEK": (7, 604800)}
UNIT_NAMES = {enum: name for name, (enum, _) in UNITS.items()}
UNIT_SECONDS = {enum: seconds for enum, seconds in UNITS.values()}

ALGORITHMS = ("fixed_window", "token_bucket", "gcra", "sliding_window")
COUNTINGS = ("reference", "atomic")

# The reference's validKeys, and ours on top.
REFERENCE_KEYS = frozenset((
    "domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
    "unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric",
    "value_to_metric", "share_threshold", "metadata"))
EXTRA_KEYS = frozenset(("algorithm", "unit_multiplier", "rate_limits", "counting", "split",
                        "regions", "home"))
VALID_KEYS = REFERENCE_KEYS | EXTRA_KEYS

MAX_UINT32 = 2**32 - 1
# The engine's longest period (fl_native.h MAX_PERIOD_MS, 49.7 days): a
# token bucket's, GCRA's or sliding window's window must fit it.  The
# reference's fixed windows count in any window up to ten years (see
# service.py: how a year is counted).
MAX_WINDOW_S = (2**32 - 1) // 1000
MAX_FIXED_WINDOW_S = 10 * 365 * 86400

# A limit's scope among regions (README "Regions").
RLS_REGION_SCOPES = ("regional", "static", "global", "home")


class ConfigError(Exception):
    """A configuration that cannot be used, worded as the reference words
    it: "<file>: <problem>"."""


@dataclass(frozen=True, eq=False)
class Limit:
    """One limit of a descriptor node, as the response reports it
    (requests_per_unit, unit, name) and as the service counts it."""
    requests_per_unit: int
    unit: int                   # the Unit enum; 0 when unlimited
    name: bytes
    unlimited: bool
    shadow_mode: bool
    quota_mode: bool
    replaces: frozenset         # names (bytes) of limits this one replaces
    algorithm: str
    window_s: int               # unit seconds x unit_multiplier
    full_key: str               # "domain.key_value.key" as the reference's stats name it
    index: int                  # which limit of the node, so each has its own counter
    counter: tuple              # counter_key(): the engine rule it counts in
    split: int = 1              # sub-buckets of each of its buckets
    regions: str = "regional"   # its scope among regions (REGION_SCOPES)
    home: str | None = None     # a home limit's region (None: the descriptor's hash)

    @property
    def current_limit(self) -> tuple[int, int, bytes]:
        return (self.requests_per_unit, self.unit, self.name)


@dataclass(eq=False)
class Node:
    """One level of a domain's descriptor tree."""
    children: dict = field(default_factory=dict)      # composite key (bytes) -> Node
    wildcards: list = field(default_factory=list)     # (parts, Node) in load order
    limits: tuple = ()                                # Limit, ... as configured
    share_pattern: bytes | None = None                # share_threshold: the value pattern
    key: bytes = b""                                  # this node's composite key
    # what a request landing here needs, worked out once per load:
    counted: tuple = ()                               # the limits that count (not unlimited)
    unlimited: bool = False                           # every limit is unlimited
    replaces: frozenset = frozenset()                 # names its limits replace


@dataclass(eq=False)
class Domain:
    name: bytes
    root: Node
    counting: str
    source: str
    descriptors: int          # nodes in the tree
    limits: int               # limits in the tree
    counting_from: str = ""   # the file that set counting ("": the default)


@dataclass(eq=False)
class RlsConfig:
    domains: dict             # name (bytes) -> Domain
    files: tuple              # the files read
    text_bytes: int = 0       # their size: the tree's memory grows with it

    @property
    def descriptor_count(self) -> int:
        return sum(d.descriptors for d in self.domains.values())

    @property
    def limit_count(self) -> int:
        return sum(d.limits for d in self.domains.values())


EMPTY = RlsConfig({}, ())


def counter_key(algorithm: str, rpu: int, window_s: int, split: int = 1,
                regions: str = "regional") -> tuple:
    """The engine rule a limit counts in: one per algorithm and numbers,
    except that the reference's fixed windows of one length share one
    (their keys keep them apart, and a changed requests_per_unit keeps
    its counts).  A split limit's rule is another one (its buckets are
    sub-buckets); an unsplit one keeps the key it always had, so its
    reserved rule number, and its counts, survive an upgrade.  So is a
    global limit's (its spends cross regions)."""
    key: tuple = (algorithm, rpu if algorithm != "fixed_window" else 0, window_s)
    if split > 1:
        key += (split,)
    return key + ("global",) if regions == "global" else key


class _Budget:
    """What rls-max-descriptors leaves to the documents still to load,
    counted as descriptors are made, so that aliases expanding to too
    many stop at the bound rather than after the whole tree is built."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.left = limit

    def spend(self, name: str) -> None:
        if self.left is None:
            return
        self.left -= 1
        if self.left < 0:
            raise ConfigError(f"{name}: the configuration has more than {self.limit} "
                              "descriptors (rls-max-descriptors)")


def config_files(path: str) -> list[str]:
    """The files a path stands for: itself, or a directory's *.yaml files
    in name order, without dotfiles (Kubernetes' ..data, ..2026_...)."""
    if not os.path.isdir(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if n.endswith(".yaml") and not n.startswith("."))
    return [os.path.join(path, n) for n in names
            if stat.S_ISREG(os.stat(os.path.join(path, n)).st_mode)]


def load(path: str, merge_domains: bool = False, max_bytes: int | None = None,
         max_descriptors: int | None = None) -> RlsConfig:
    """Loads a file or directory all or nothing; ConfigError naming the
    file and the problem otherwise.  With merge_domains (the reference's
    MERGE_DOMAIN_CONFIG) files of one domain make one tree; without it a
    second file of a domain is an error.  max_bytes bounds the files
    together (rls-max-config-bytes), max_descriptors the descriptors of
    every domain together (rls-max-descriptors); None: no bound."""
    try:
        files = config_files(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e.strerror}") from None
    texts, size = [], 0
    for name in files:
        data = _read(name, None if max_bytes is None else max_bytes - size + 1)
        size += len(data)
        if max_bytes is not None and size > max_bytes:
            raise ConfigError(f"{name}: the configuration (its files together) is more than "
                              f"{_too_large(max_bytes)}")
        texts.append((name, _decode(name, data)))
    return _config([(name, _parse(name, text)) for name, text in texts], tuple(files),
                   size, merge_domains, _Budget(max_descriptors))


def load_documents(named_docs, size: int = 0, merge_domains: bool = False,
                   max_bytes: int | None = None,
                   max_descriptors: int | None = None) -> RlsConfig:
    """Loads (name, document) pairs (each what one YAML file would parse
    to: an xDS RateLimitConfig, say) all or nothing, with the files'
    checks, errors and bounds (see load), the name standing for the file;
    size is what the documents took to send."""
    named_docs = list(named_docs)
    if max_bytes is not None and size > max_bytes:
        raise ConfigError(f"the configuration is {size} bytes, more than "
                          f"{_too_large(max_bytes)}")
    return _config(named_docs, tuple(name for name, _ in named_docs), size, merge_domains,
                   _Budget(max_descriptors))


def _config(named_docs: list, names: tuple, size: int, merge: bool,
            budget: _Budget) -> RlsConfig:
    """One configuration of several domains, each document checked
    against the ones before it (a second one of a domain: see load)."""
    domains: dict[bytes, Domain] = {}
    for name, doc in named_docs:
        domain = load_document(name, doc, domains, merge, budget)
        domains[domain.name] = domain
    return RlsConfig(domains, names, size)


def _too_large(max_bytes: int) -> str:
    return f"the {max_bytes} bytes of rls-max-config-bytes"


def _read(name: str, most: int | None) -> bytes:
    """A file's bytes, no more than most of them (None: all)."""
    try:
        with open(name, "rb") as f:
            return f.read() if most is None else f.read(most)
    except OSError as e:
        raise ConfigError(f"{name}: cannot read the configuration: {e}") from None


def _decode(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: cannot read the configuration: {e}") from None


def load_text(name: str, text: str, loaded: dict | None = None, merge: bool = False) -> Domain:
    """One file's domain (ConfigFileContentToYaml then loadConfig).
    loaded holds the domains of the files before it: a domain already
    there is an error, or with merge the file's descriptors are added to
    its tree (which is returned)."""
    return load_document(name, _parse(name, text), loaded, merge)


def _parse(name: str, text: str) -> dict:
    from fastlimit.rls import goyaml  # PyYAML only once a file is read

    try:
        doc = goyaml.parse(text)
    except goyaml.YAMLError as e:
        raise ConfigError(f"{name}: error loading config file: {goyaml.problem(e)}") from None
    except RecursionError:
        raise ConfigError(f"{name}: error loading config file: nested too deeply") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{name}: error loading config file: yaml: unmarshal errors: "
                          f"cannot unmarshal {type(doc).__name__} into a map")
    return doc


def load_document(name: str, doc: dict, loaded: dict | None = None,
                  merge: bool = False, budget: _Budget | None = None) -> Domain:
    """One document's domain (loadConfig), named name in its errors; see
    load_text for loaded and merge, _Budget for budget (None: no bound)."""
    try:
        _validate_keys(name, doc)
        return _Loader(name, budget or _Budget(None)).domain(doc, loaded or {}, merge)
    except RecursionError:
        raise ConfigError(f"{name}: error loading config file: nested too deeply") from None


def _validate_keys(name: str, mapping: dict) -> None:
    """validateYamlKeys: every key known, lists only of maps, leaves only
    strings, integers, booleans or null; metadata is not looked into."""
    for k, v in mapping.items():
        if not isinstance(k, str):
            raise ConfigError(f"{name}: config error, key is not of type string: {k}")
        if k not in VALID_KEYS:
            raise ConfigError(f"{name}: config error, unknown key '{k}'")
        if k == "metadata":
            continue
        if isinstance(v, list):
            for e in v:
                if not isinstance(e, dict):
                    raise ConfigError(f"{name}: config error, yaml file contains list of type "
                                      f"other than map: {e}")
                _validate_keys(name, e)
        elif isinstance(v, dict):
            _validate_keys(name, v)
        elif v is not None and not isinstance(v, (str, int)):   # bool is an int
            raise ConfigError(f"{name}: error checking config")


def _text(v) -> str:
    """A YAML scalar read into a Go string field: its text."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class _Loader:
    def __init__(self, name: str, budget: _Budget):
        self.name = name
        self.budget = budget
        self.descriptors = 0
        self.limits = 0

    def error(self, problem: str) -> ConfigError:
        return ConfigError(f"{self.name}: {problem}")

    def unmarshal(self, field_name: str, v, kind):
        """The struct decode's type checks (yaml.Unmarshal into YamlRoot)."""
        if v is None:
            return kind()
        ok = {bool: isinstance(v, bool),
              int: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_UINT32,
              str: not isinstance(v, (list, dict)),
              list: isinstance(v, list),
              dict: isinstance(v, dict)}[kind]
        if not ok:
            want = {bool: "bool", int: "uint32", str: "string", list: "a list",
                    dict: "a map"}[kind]
            raise self.error(f"error loading config file: yaml: unmarshal errors: "
                             f"cannot unmarshal {v!r} into {field_name} ({want})")
        return _text(v) if kind is str else v

    def domain(self, doc: dict, loaded: dict, merge: bool) -> Domain:
        """loadConfig: a new domain, or with merge the domain of an earlier
        file with this file's descriptors added at its top level, where
        a key both files have is a duplicate composite key."""
        domain = self.unmarshal("domain", doc.get("domain"), str)
        descriptors = self.unmarshal("descriptors", doc.get("descriptors"), list)
        counting = self.unmarshal("counting", doc.get("counting"), str)
        if domain == "":
            raise self.error("config file cannot have empty domain")
        if counting not in COUNTINGS + ("",):
            raise self.error(f"invalid counting '{counting}' (reference or atomic)")
        name = domain.encode("utf-8")
        earlier = loaded.get(name)
        if earlier is None:
            root = Node()
            self.load_descriptors(root, domain + ".", descriptors)
            return Domain(name, root, counting or "reference", self.name, self.descriptors,
                          self.limits, self.name if counting else "")
        if not merge:
            raise self.error(f"duplicate domain '{domain}' in config file")
        if counting and earlier.counting_from and counting != earlier.counting:
            raise self.error(f"counting '{counting}' of domain '{domain}' differs from the "
                             f"'{earlier.counting}' of {earlier.counting_from}")
        self.load_descriptors(earlier.root, domain + ".", descriptors)
        if counting:
            earlier.counting, earlier.counting_from = counting, self.name
        earlier.descriptors += self.descriptors
        earlier.limits += self.limits
        return earlier

    def load_descriptors(self, parent: Node, parent_key: str, descriptors: list) -> None:
        """loadDescriptors, level by level."""
        for d in descriptors:
            key = self.unmarshal("key", d.get("key"), str)
            value = self.unmarshal("value", d.get("value"), str)
            if key == "":
                raise self.error("descriptor has empty key")
            final_key = key + "_" + value if value != "" else key
            full_key = parent_key + final_key
            composite = final_key.encode("utf-8")
            if composite in parent.children:
                raise self.error(f"duplicate descriptor composite key '{full_key}'")
            flags = {f: self.unmarshal(f, d.get(f), bool) for f in (
                "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric",
                "share_threshold")}
            policies = []
            if d.get("rate_limit") is not None:
                policies.append(self.unmarshal("rate_limit", d["rate_limit"], dict))
            policies += self.unmarshal("rate_limits", d.get("rate_limits"), list)
            limits = tuple(self.limit(p, i, full_key, flags) for i, p in enumerate(policies))
            if flags["share_threshold"] and "*" not in final_key:
                raise self.error("share_threshold can only be used with wildcard values "
                                 f"(containing '*'), but found key '{final_key}'")
            counted = tuple(lim for lim in limits if not lim.unlimited)
            node = Node(limits=limits, key=composite, counted=counted,
                        unlimited=bool(limits) and not counted,
                        replaces=frozenset().union(*(lim.replaces for lim in limits)))
            if flags["share_threshold"]:
                node.share_pattern = final_key[len(key) + 1:].encode("utf-8") \
                    if final_key.startswith(key + "_") else composite
            if "*" in final_key:
                parent.wildcards.append((tuple(composite.split(b"*")), node))
            self.budget.spend(self.name)
            self.descriptors += 1
            self.limits += len(limits)
            self.load_descriptors(node, full_key + ".",
                                  self.unmarshal("descriptors", d.get("descriptors"), list))
            parent.children[composite] = node

    def limit(self, p: dict, index: int, full_key: str, flags: dict) -> Limit:
        rpu = self.unmarshal("requests_per_unit", p.get("requests_per_unit"), int)
        unit_text = self.unmarshal("unit", p.get("unit"), str)
        unlimited = self.unmarshal("unlimited", p.get("unlimited"), bool)
        name = self.unmarshal("name", p.get("name"), str)
        replaces = [self.unmarshal("name", self.unmarshal("replaces", r, dict).get("name"), str)
                    for r in self.unmarshal("replaces", p.get("replaces"), list)]
        algorithm = self.unmarshal("algorithm", p.get("algorithm"), str) or "fixed_window"
        multiplier = self.unmarshal("unit_multiplier", p.get("unit_multiplier"), int) \
            if p.get("unit_multiplier") is not None else 1
        split = self.unmarshal("split", p.get("split"), int) if p.get("split") is not None \
            else 1
        regions = self.unmarshal("regions", p.get("regions"), str) or "regional"
        home = self.unmarshal("home", p.get("home"), str) or None
        unit_enum, unit_s = UNITS.get(unit_text.upper(), (0, 0))
        if unlimited:
            if unit_enum:
                raise self.error("should not specify rate limit unit when unlimited")
        elif not unit_enum:
            raise self.error(f"invalid rate limit unit '{unit_text}'")
        for r in replaces:
            if r == "":
                raise self.error("should not have an empty replaces entry")
            if r == name:
                raise self.error("replaces should not contain name of same descriptor")
        if algorithm not in ALGORITHMS:
            raise self.error(f"invalid algorithm '{algorithm}' (one of {', '.join(ALGORITHMS)})")
        if multiplier < 1:
            raise self.error("unit_multiplier must be at least 1")
        window_s = unit_s * multiplier
        longest = MAX_FIXED_WINDOW_S if algorithm == "fixed_window" else MAX_WINDOW_S
        if not unlimited and window_s > longest:
            raise self.error(f"a window of {window_s} s is longer than the {longest} s "
                             f"of the {algorithm} algorithm")
        if algorithm != "fixed_window" and not unlimited and rpu == 0:
            raise self.error(f"algorithm {algorithm} needs requests_per_unit of at least 1")
        self.check_split(split, algorithm, rpu, window_s)
        if regions not in RLS_REGION_SCOPES:
            raise self.error(f"invalid regions '{regions}' (one of "
                             f"{', '.join(RLS_REGION_SCOPES)})")
        if regions in ("global", "home") and split > 1:
            raise self.error(f"a {regions} limit cannot be split (its hits are counted per "
                             "whole bucket)")
        if home is not None and (regions != "home" or not REGION_NAME.fullmatch(home)):
            raise self.error("home names a region (1 to 64 of A-Z a-z 0-9 _ -) of a limit "
                             "with regions: home")
        return Limit(rpu, unit_enum, name.encode("utf-8"), unlimited, flags["shadow_mode"],
                     flags["quota_mode"], frozenset(r.encode("utf-8") for r in replaces),
                     algorithm, window_s, full_key, index,
                     counter_key(algorithm, rpu, window_s, split, regions), split, regions,
                     home)

    def check_split(self, split: int, algorithm: str, rpu: int, window_s: int) -> None:
        if split == 1:
            return
        if not 1 <= split <= MAX_SPLIT:
            raise self.error(f"split must be from 1 to {MAX_SPLIT}")
        if algorithm == "fixed_window":
            raise self.error("split needs algorithm token_bucket, gcra or sliding_window "
                             "(a fixed_window counter is counted whole)")
        if rpu < split:
            raise self.error(f"split {split} is more than requests_per_unit {rpu}: every "
                             "sub-bucket needs a token")
        if window_s * split > MAX_WINDOW_S:
            raise self.error(f"split {split} makes a sub-bucket's window of {window_s} s x "
                             f"{split} longer than the {MAX_WINDOW_S} s of the engine")


def with_regions(config: RlsConfig, regions: Regions | None) -> RlsConfig:
    """The configuration as this region enforces it: each static limit's
    requests_per_unit its equal share (rounded down), in place (the tree
    was just loaded and is not in force yet); ConfigError if a share holds
    no request.  Without regions, every limit whole."""
    if regions is None:
        return config
    for domain in config.domains.values():
        _share_limits(domain.root, domain.source, regions)
    return config


def _share_limits(node: Node, source: str, regions: Regions) -> None:
    for limit in node.limits:
        if limit.home is not None and limit.home not in regions.names:
            raise ConfigError(f"{source}: {limit.full_key}: home '{limit.home}' is not one "
                              f"of the regions ({' '.join(regions.names)})")
    if any(limit.regions == "static" and not limit.unlimited for limit in node.limits):
        node.limits = tuple(_shared(limit, source, regions) for limit in node.limits)
        node.counted = tuple(limit for limit in node.limits if not limit.unlimited)
    for child in node.children.values():
        _share_limits(child, source, regions)


def _shared(limit: Limit, source: str, regions: Regions) -> Limit:
    if limit.regions != "static" or limit.unlimited or limit.requests_per_unit == 0:
        return limit
    try:
        rpu = share_count(limit.requests_per_unit, *regions.weights(()))
    except ValueError as e:
        raise ConfigError(f"{source}: {limit.full_key}: {e}") from None
    return replace(limit, requests_per_unit=rpu, counter=counter_key(
        limit.algorithm, rpu, limit.window_s, limit.split, limit.regions))
