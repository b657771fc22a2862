# cython: language_level=3
"""ShouldRateLimit's decision, as envoyproxy/ratelimit makes it
(src/service/ratelimit.go, src/limiter/base_limiter.go,
src/config/config_impl.go GetLimit), in C over fastlimit's engine: the
contract and the structures are in _rls.pxd, the counters' meaning (which
engine rule a limit counts in, and how a fixed window is counted) in
rls/service.py, which compiles a configuration here when it loads one.

The walk (GetLimit), per entry (k, v): the exact child "k_v", else the
first wildcard child in load order matching "k_v" (each '*' any run of
bytes), else the key-only child k; a limit counts only at the
descriptor's last entry; a child without children ends the walk; no
backtracking.

Counting is the reference's by default: every matched limit of every
descriptor is counted, whatever the others say.  A domain with
``counting: atomic`` is fastlimit's all or nothing: every limit of the
request is read first, and only if the request passes is anything spent.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy

from fastlimit._core cimport CheckResult, FL_OK
from fastlimit._load cimport (FL_PRIO_NORMAL, FL_PRIO_UNSET, LoadMeter, fl_load_count_shed,
                              fl_load_sheds, fl_priority_parse)
from fastlimit._rules cimport RuleEngine, fnv1a64
from fastlimit._rules import home_index

import heapq

from fastlimit.structured_fields import sf_string

# The reference counter's engine limit (the engine's largest): never reached.
COUNTER_LIMIT = 10**15
cdef int64_t C_COUNTER_LIMIT = 10**15
cdef uint32_t MAX_UINT32 = 0xffffffff
# A descriptor entry that sets the request's priority for shedding (README,
# "Overload"); it is taken out before matching.  Envoy sets it with a
# generic_key action's descriptor_key.  A shed request is allowed, as the
# reference's users fail open, and says so in a response header.
PRIORITY_ENTRY = b"x-fastlimit-priority"
cdef const char* PRIORITY_ENTRY_C = "x-fastlimit-priority"
cdef size_t PRIORITY_ENTRY_N = 20
SHED_HEADER = (b"x-fastlimit-shed", b"1")
# Redis's words, as the reference passes on its Redis's refusal.
READONLY = "READONLY You can't write against a read only replica."
# The reference's NEAR_LIMIT_RATIO.
NEAR_LIMIT_RATIO = 0.8
LIMIT_STAT_FIELDS = ("total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode")
DOMAIN_STAT_FIELDS = ("calls", "over_limit", "shadow", "limits_over")
ALGORITHMS = ("fixed_window", "token_bucket", "gcra", "sliding_window")
# RateLimitResponse.RateLimit.Unit -> seconds, as utils.UnitToDivider has them
# Nodes compiled between two points where a compiling thread (a reload's
# off the loop) lets the loop's thread take the GIL: tens of microseconds.
cdef uint32_t NODES_PER_SLICE = 64
cdef size_t CHUNK_BYTES = 64 * 1024
cdef int64_t UNIT_SECONDS[8]
UNIT_SECONDS[:] = [0, 1, 60, 3600, 86400, 2592000, 31536000, 604800]


class RlsError(Exception):
    """A request the service refuses: sent as gRPC status UNKNOWN (2) with
    this message, as the reference does."""


class RlsHome(Exception):
    """A request with a home limit whose descriptor lives in another
    region (`home`, an index of the regions), which answers the whole
    request (README "Home rules"): the front asks it over the region link
    (regions/subsystem.py ask_home_rls)."""

    def __init__(self, home: int):
        super().__init__(f"the request's home region ({home}) is another region")
        self.home = home


cdef inline bint same(Slice a, const char* p, size_t n) noexcept nogil:
    return a.n == n and memcmp(a.p, p, n) == 0


cdef Child* lookup(Child* slots, uint32_t mask, const char* p, size_t n) noexcept nogil:
    """The slot holding key p (its node NULL when absent)."""
    cdef uint64_t h = fnv1a64(p, n)
    cdef uint32_t i = <uint32_t>h & mask
    while slots[i].node != NULL:
        if slots[i].hash == h and same(slots[i].key, p, n):
            return &slots[i]
        i = (i + 1) & mask
    return &slots[i]


cdef bint wildcard_match(const Wild* w, const char* p, size_t n) noexcept nogil:
    """wildcardMatch: the value against a pattern split on '*'."""
    cdef const Slice* parts = w.parts
    cdef Slice first, last, part
    cdef size_t pos, end, i, j
    cdef bint found
    if w.nparts == 1:
        return same(parts[0], p, n)
    if n < w.min_len:
        return False
    first = parts[0]
    last = parts[w.nparts - 1]
    if memcmp(p, first.p, first.n) != 0 or memcmp(p + n - last.n, last.p, last.n) != 0:
        return False
    end = n - last.n
    pos = first.n
    for i in range(1, w.nparts - 1):
        part = parts[i]
        found = False
        j = pos
        while j + part.n <= end:
            if memcmp(p + j, part.p, part.n) == 0:
                found = True
                break
            j += 1
        if not found:
            return False
        pos = j + part.n
    return True


cdef int fl_room(void** p, size_t* cap, size_t need, size_t size, size_t first) noexcept nogil:
    """Room for `need` items of `size` bytes in the realloc'd array *p of
    *cap items, doubling from `first`; 0, or -1 when memory is short (*p
    kept).  Every per-call scratch array of the decision and of the gRPC
    front's decoder grows this way."""
    cdef size_t n = cap[0] if cap[0] else first
    cdef void* q
    if need <= cap[0]:
        return 0
    while n < need:
        n *= 2
    q = realloc(p[0], n * size)
    if q == NULL:
        return -1
    p[0] = q
    cap[0] = n
    return 0


cdef inline int grow(void** p, size_t* cap, size_t need, size_t size,
                     size_t first=8) except -1:
    if fl_room(p, cap, need, size, first) != 0:
        raise MemoryError()
    return 0


cdef class Compiled:
    """A configuration's domains as C structures (one arena, freed with
    the object), built where it loads (any thread: nothing shared is
    touched), their engine rule numbers set and the statistics of the one
    in force carried over when it is put in force."""

    def __dealloc__(self):
        cdef size_t i
        for i in range(self.nchunks):
            free(self.chunks[i])
        free(self.chunks)
        free(self.nums)
        free(self.limit_stats)
        free(self.domain_stats)
        free(self.limit_from)
        free(self.domain_from)

    cdef void* alloc(self, size_t n) except NULL:
        """n zeroed bytes of the arena, 16-aligned: chunks of CHUNK_BYTES
        (a larger request gets a chunk of its own), so a configuration
        is a few allocations, freed in a few calls."""
        cdef void* p
        n = ((n if n else 1) + 15) & ~(<size_t>15)
        if n > self.chunk_left:
            grow(<void**>&self.chunks, &self.chunks_cap, self.nchunks + 1, sizeof(void*), 16)
            p = calloc(1, n if n > CHUNK_BYTES else CHUNK_BYTES)
            if p == NULL:
                raise MemoryError()
            self.chunks[self.nchunks] = p
            self.nchunks += 1
            if n > CHUNK_BYTES:
                return p
            self.chunk_at = <char*>p
            self.chunk_left = CHUNK_BYTES
        p = self.chunk_at
        self.chunk_at += n
        self.chunk_left -= n
        return p

    cdef Slice keep(self, bytes b) except *:
        """b's bytes copied into the arena."""
        cdef Slice s
        s.n = PyBytes_GET_SIZE(b)
        s.p = <const char*>self.alloc(s.n)
        memcpy(<char*>s.p, PyBytes_AS_STRING(b), s.n)
        return s

    def __init__(self, config, regions=None):
        """config: rls/config.py RlsConfig (its static limits already this
        region's share); regions: regions/shares.py Regions or None."""
        cdef list counters = []
        cdef dict counter_index = {}
        cdef dict names = {}
        cdef list stat_keys = []
        cdef uint32_t i = 0
        cdef CDomain* d
        cdef Child* slot
        self.domain_names = list(config.domains)
        self.ndomains = len(self.domain_names)
        self.domains = <CDomain*>self.alloc(sizeof(CDomain) * self.ndomains)
        self.domain_mask = table_size(self.ndomains) - 1
        self.domain_slots = <Child*>self.alloc(sizeof(Child) * (self.domain_mask + 1))
        self.has_home = False
        for name, domain in config.domains.items():
            d = &self.domains[i]
            d.name = self.keep(name)
            d.atomic = domain.counting == "atomic"
            d.stat = i
            d.root = self.node(domain.root, (name, domain.source), counters, counter_index,
                               names, stat_keys, regions)
            slot = lookup(self.domain_slots, self.domain_mask, d.name.p, d.name.n)
            slot.hash = fnv1a64(d.name.p, d.name.n)
            slot.key = d.name
            slot.node = <CNode*>d
            i += 1
        self.counters = counters
        self.nums = <uint32_t*>calloc(max(1, len(counters)), sizeof(uint32_t))
        self.stat_keys = stat_keys
        self.limit_stats = <LimitStat*>calloc(max(1, len(stat_keys)), sizeof(LimitStat))
        self.domain_stats = <DomainStat*>calloc(max(1, self.ndomains), sizeof(DomainStat))
        if self.nums == NULL or self.limit_stats == NULL or self.domain_stats == NULL:
            raise MemoryError()

    cdef CNode* node(self, root, tuple domain, list counters, dict counter_index, dict names,
                     list stat_keys, regions) except NULL:
        """The tree under root, built level by level (no recursion: its
        depth is the file's)."""
        cdef CNode* top = <CNode*>self.alloc(sizeof(CNode))
        cdef list todo = [(root, <size_t>top)]
        cdef dict made = {id(root): <size_t>top}   # a wildcard child is a child too
        cdef CNode* c
        cdef Child* slot
        cdef uint32_t j
        while todo:
            self.breathe()
            py, addr = todo.pop()
            c = <CNode*><size_t>addr
            self.fill(c, py, domain, counters, counter_index, names, stat_keys, regions)
            if py.children:
                c.has_children = True
                c.mask = table_size(len(py.children)) - 1
                c.slots = <Child*>self.alloc(sizeof(Child) * (c.mask + 1))
                for key, child in py.children.items():
                    self.breathe()
                    slot = lookup(c.slots, c.mask, PyBytes_AS_STRING(key), len(key))
                    slot.key = self.keep(key)
                    slot.hash = fnv1a64(slot.key.p, slot.key.n)
                    slot.node = self.made(child, made, todo)
            c.nwild = len(py.wildcards)
            if c.nwild:
                c.wild = <Wild*>self.alloc(sizeof(Wild) * c.nwild)
                for j, (parts, child) in enumerate(py.wildcards):
                    self.breathe()
                    c.wild[j].nparts = len(parts)
                    c.wild[j].parts = <Slice*>self.alloc(sizeof(Slice) * len(parts))
                    for k, part in enumerate(parts):
                        c.wild[j].parts[k] = self.keep(part)
                        c.wild[j].min_len += len(part)
                    c.wild[j].node = self.made(child, made, todo)
        return top

    cdef void breathe(self) noexcept:
        """Every NODES_PER_SLICE pieces of work, a point where another
        thread (the loop's, while this one compiles off it) may take the
        GIL: Cython code never offers it by itself."""
        self.work += 1
        if self.work % NODES_PER_SLICE == 0:
            with nogil:
                pass

    cdef CNode* made(self, py, dict made, list todo) except NULL:
        """py's CNode: the one made already, or a new one to fill."""
        cdef CNode* c
        addr = made.get(id(py))
        if addr is not None:
            return <CNode*><size_t>addr
        c = <CNode*>self.alloc(sizeof(CNode))
        made[id(py)] = <size_t>c
        todo.append((py, <size_t>c))
        return c

    cdef int fill(self, CNode* c, py, tuple domain, list counters, dict counter_index,
                  dict names, list stat_keys, regions) except -1:
        """One node's own part: its limits, replaces and share pattern;
        domain: (its name, the file that configured it)."""
        cdef uint32_t j
        cdef CLimit* lim
        c.has_limits = bool(py.limits)
        c.unlimited = py.unlimited
        if py.share_pattern is not None:
            c.has_share = True
            c.share_pattern = self.keep(py.share_pattern)
        c.nreplaces = len(py.replaces)
        if c.nreplaces:
            c.replaces = <int32_t*>self.alloc(sizeof(int32_t) * c.nreplaces)
            for j, name in enumerate(sorted(py.replaces)):
                c.replaces[j] = names.setdefault(name, len(names))
        c.nlimits = len(py.counted)
        if not c.nlimits:
            return 0
        c.limits = <CLimit*>self.alloc(sizeof(CLimit) * c.nlimits)
        for j, limit in enumerate(py.counted):
            lim = &c.limits[j]
            lim.rpu = limit.requests_per_unit
            lim.unit = limit.unit
            lim.name = self.keep(limit.name)
            lim.full_key = self.keep(limit.full_key.encode())
            lim.shadow = limit.shadow_mode
            lim.quota = limit.quota_mode
            lim.algorithm = ALGORITHMS.index(limit.algorithm)
            lim.window_s = limit.window_s
            lim.index = limit.index
            lim.counter = counter_index.setdefault(limit.counter, len(counters))
            if lim.counter == len(counters):
                counters.append((limit.counter, limit, domain[1]))
            lim.name_id = names.setdefault(limit.name, len(names)) if limit.name else -1
            lim.home = HOME_NOT
            if limit.regions == "home" and regions is not None:
                self.has_home = True
                lim.home = regions.names.index(limit.home) if limit.home is not None \
                    else HOME_HASH
            lim.stat = len(stat_keys)
            stat_keys.append((domain[0], limit.full_key, limit.index))
        return 0

    cdef const CDomain* domain(self, const char* p, size_t n) noexcept:
        cdef Child* slot = lookup(self.domain_slots, self.domain_mask, p, n)
        return <const CDomain*>slot.node

    def set_numbers(self, dict num_by_counter):
        """Each counter's engine rule number, once they are defined."""
        for i, (key, _, _) in enumerate(self.counters):
            self.nums[i] = num_by_counter[key]

    def carry_from(self, Compiled old):
        """Which of old's statistics each limit and domain of this one
        takes over (by domain, limit name and index): worked out where the
        configuration is prepared (off the loop), so that putting it in
        force copies them in C."""
        cdef dict index = {key: i for i, key in enumerate(old.stat_keys)}
        cdef uint32_t i
        free(self.limit_from)
        free(self.domain_from)
        self.limit_from = <int32_t*>malloc(max(1, len(self.stat_keys)) * sizeof(int32_t))
        self.domain_from = <int32_t*>malloc(max(1, self.ndomains) * sizeof(int32_t))
        if self.limit_from == NULL or self.domain_from == NULL:
            raise MemoryError()
        for i, key in enumerate(self.stat_keys):
            self.breathe()
            self.limit_from[i] = index.get(key, -1)
        self.stat_order = self.sorted_stats()
        index = {name: i for i, name in enumerate(old.domain_names)}
        for i, name in enumerate(self.domain_names):
            self.domain_from[i] = index.get(name, -1)
        self.carried_from = old

    def take_stats(self, Compiled old):
        """The statistics old kept, for the limits and domains this one has
        too: a reload keeps them."""
        cdef uint32_t i, n = len(self.stat_keys)
        if self.carried_from is not old:
            self.carry_from(old)
        for i in range(n):
            if self.limit_from[i] >= 0:
                self.limit_stats[i] = old.limit_stats[self.limit_from[i]]
        for i in range(self.ndomains):
            if self.domain_from[i] >= 0:
                self.domain_stats[i] = old.domain_stats[self.domain_from[i]]
        self.carried_from = None

    cdef list sorted_stats(self):
        """limit_stats' indexes in stat_keys' order, sorted in runs that
        are merged in Python (heapq.merge), so that a thread sorting
        10,000 keys lets the loop run between runs."""
        keys = self.stat_keys
        runs = []
        for start in range(0, len(keys), NODES_PER_SLICE):
            self.breathe()
            runs.append(sorted(range(start, min(len(keys), start + NODES_PER_SLICE)),
                               key=keys.__getitem__))
        return list(heapq.merge(*runs, key=keys.__getitem__))

    def limit_stat_rows(self, first=None):
        """[((domain, full_key, index), (LIMIT_STAT_FIELDS' values))] in
        key order, only the first `first` of them when given: INFO shows a
        few of 10,000 limits without going through them all."""
        cdef LimitStat* s
        if self.stat_order is None:
            self.stat_order = self.sorted_stats()
        out = []
        for i in (self.stat_order if first is None else self.stat_order[:first]):
            s = &self.limit_stats[<uint32_t>i]
            out.append((self.stat_keys[i], (s.total_hits, s.within_limit, s.near_limit,
                                            s.over_limit, s.shadow_mode)))
        return out

    def domain_stat_items(self):
        """[(domain, {field: value})]."""
        cdef DomainStat* s
        out = []
        for i, name in enumerate(self.domain_names):
            s = &self.domain_stats[<uint32_t>i]
            out.append((name, {"calls": s.calls, "over_limit": s.over_limit,
                               "shadow": s.shadow, "limits_over": s.limits_over}))
        return out


cdef uint32_t table_size(size_t n) noexcept:
    """A power of two at least twice n (probes stay short)."""
    cdef uint32_t size = 4
    while size < 2 * n:
        size *= 2
    return size


def walk_limits(root):
    """Every limit of a tree (without recursion: its depth is the file's)."""
    for node in walk_nodes(root):
        yield from node.limits


def walk_nodes(root):
    stack = [root]
    while stack:
        for child in stack.pop().children.values():
            yield child
            stack.append(child)


cdef void count_limit(LimitStat* s, int64_t rpu, int64_t before, int64_t hits,
                      bint over) noexcept:
    """One limit's hits as the reference's stats count them
    (base_limiter.go): hits, not calls; before: what it had used before."""
    cdef int64_t near = <int64_t>(rpu * NEAR_LIMIT_RATIO)
    cdef int64_t after = before + hits
    s.total_hits += hits
    if over:
        if before >= rpu:
            s.over_limit += hits
        else:
            s.over_limit += after - rpu
            s.near_limit += rpu - (near if near > before else before)
    else:
        s.within_limit += hits
        if after > near:
            s.near_limit += hits if before >= near else after - near


cdef inline bint tighter(const RlsStatus* a, const RlsStatus* b) noexcept:
    """Whether status a describes the request better than b: refused
    first (the longest wait), then the fewest remaining."""
    if (a.code == RLS_OVER_LIMIT) != (b.code == RLS_OVER_LIMIT):
        return a.code == RLS_OVER_LIMIT
    if a.code == RLS_OVER_LIMIT:
        return a.reset_s > b.reset_s
    return a.remaining < b.remaining


cdef inline void no_match(RlsStatus* s) noexcept:
    s.code = RLS_OK
    s.has_limit = False
    s.remaining = 0
    s.reset_s = 0


cdef size_t put_decimal(char* out, uint64_t v) noexcept:
    cdef char tmp[24]
    cdef size_t n = 0, i
    while True:
        tmp[n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n


cdef size_t put_field(char* out, const char* p, size_t n) noexcept:
    """<length>:<bytes>."""
    cdef size_t at = put_decimal(out, n)
    out[at] = 58     # ':'
    memcpy(out + at + 1, p, n)
    return at + 1 + n


cdef class Decider:
    """The decision of one server (RateLimitService.decider): the
    configuration in force, the statistics it keeps, and the settings a
    decision reads."""

    def __cinit__(self, RuleEngine engine, service):
        self.engine = engine
        self.service = service
        self.read_only = lambda: False
        self.region_here = -1
        self.compiled = Compiled(_EmptyConfig())

    def __dealloc__(self):
        free(self.statuses)
        free(self.nodes)
        free(self.hits)
        free(self.shares)
        free(self.replacing)
        free(self.key)
        free(self.commits)
        free(self.entries)
        free(self.kept)

    @property
    def compiled_config(self):
        return self.compiled

    def install(self, Compiled compiled):
        """Puts a compiled configuration in force (its numbers set), with
        the statistics of the one before; returns that one."""
        cdef Compiled old = self.compiled
        compiled.take_stats(old)
        self.compiled = compiled
        return old

    # ---- the decision ------------------------------------------------------------

    cdef int decide(self, const RlsRequest* request, RlsOutcome* out) except -1:
        """The decision of request into out (out.statuses: this Decider's,
        valid until the next call); RlsError or RlsHome raised for a
        request the service refuses or another region answers."""
        cdef const CDomain* dom
        cdef uint32_t i
        cdef int priority
        cdef RlsRequest copy = request[0]   # without its priority entries
        cdef RlsRequest* req = &copy
        if req.domain.n == 0:
            raise RlsError("rate limit domain must not be empty")
        if req.ndescriptors == 0:
            raise RlsError("rate limit descriptor list must not be empty")
        self.reserve(req)
        out.statuses = self.statuses
        out.n = req.ndescriptors
        out.overall = RLS_OK
        out.shed = False
        out.chosen = -1
        dom = self.compiled.domain(req.domain.p, req.domain.n)
        if dom == NULL:
            self.unknown_domain += 1
            for i in range(out.n):
                no_match(&out.statuses[i])
            return 0
        priority = self.take_priority(req)
        if self.load is not None and fl_load_sheds(&self.load.l, priority):
            fl_load_count_shed(&self.load.l, priority, True)
            for i in range(out.n):
                no_match(&out.statuses[i])
            out.shed = True
            return 0
        if self.spent(req) and self.read_only():
            raise RlsError(READONLY)
        self.match(dom, req)
        if self.compiled.has_home and not self.home_local:
            self.check_home(dom, req)
        self.count(dom, req, out)
        self.last = copy
        return 0

    cdef int reserve(self, const RlsRequest* req) except -1:
        """Room for req in the per-call arrays."""
        cdef uint32_t entries = 0, i
        cdef size_t cap
        for i in range(req.ndescriptors):
            entries += req.descriptors[i].nentries
        grow(<void**>&self.statuses, &self.status_cap, req.ndescriptors, sizeof(RlsStatus))
        if req.ndescriptors > self.desc_cap:
            cap = self.desc_cap
            grow(<void**>&self.nodes, &cap, req.ndescriptors, sizeof(CNode*))
            cap = self.desc_cap
            grow(<void**>&self.hits, &cap, req.ndescriptors, sizeof(uint64_t))
            self.desc_cap = cap
        grow(<void**>&self.shares, &self.share_cap, entries, sizeof(Slice))
        return 0

    cdef int take_priority(self, RlsRequest* req) except -1:
        """The highest priority req's x-fastlimit-priority entries name
        (normal when none does); those entries are taken out of req (into
        this Decider's copies).  RlsError for one that is no priority."""
        cdef uint32_t i, j, n = 0, total = 0
        cdef bint any_entry = False
        cdef int priority = FL_PRIO_UNSET, p
        cdef RlsEntry* e
        for i in range(req.ndescriptors):
            for j in range(req.descriptors[i].nentries):
                if same(req.descriptors[i].entries[j].key, PRIORITY_ENTRY_C,
                        PRIORITY_ENTRY_N):
                    any_entry = True
            total += req.descriptors[i].nentries
        if not any_entry:
            return FL_PRIO_NORMAL
        grow(<void**>&self.entries, &self.entries_cap, total, sizeof(RlsEntry))
        grow(<void**>&self.kept, &self.kept_cap, req.ndescriptors, sizeof(RlsDescriptor))
        for i in range(req.ndescriptors):
            self.kept[i] = req.descriptors[i]
            self.kept[i].entries = self.entries + n
            self.kept[i].nentries = 0
            for j in range(req.descriptors[i].nentries):
                e = &req.descriptors[i].entries[j]
                if same(e.key, PRIORITY_ENTRY_C, PRIORITY_ENTRY_N):
                    p = fl_priority_parse(e.value.p, e.value.n)
                    if p == FL_PRIO_UNSET:
                        raise RlsError(
                            f"{PRIORITY_ENTRY.decode()} must be low, normal or critical")
                    if p > priority:
                        priority = p
                    continue
                self.entries[n] = e[0]
                n += 1
                self.kept[i].nentries += 1
        req.descriptors = self.kept
        return priority

    cdef bint spent(self, const RlsRequest* req) noexcept:
        """Each descriptor's hits into self.hits (its own hits_addend, else
        the request's, at least 1), capped past the counters' limit; whether
        any is above 0."""
        cdef uint64_t request_hits = req.hits_addend if req.hits_addend > 0 else 1
        cdef uint64_t h
        cdef bint any_hits = False
        cdef uint32_t i
        for i in range(req.ndescriptors):
            h = req.descriptors[i].hits if req.descriptors[i].has_hits else request_hits
            if h > <uint64_t>C_COUNTER_LIMIT + 1:
                h = C_COUNTER_LIMIT + 1
            self.hits[i] = h
            any_hits |= h > 0
        return any_hits

    cdef int match(self, const CDomain* dom, const RlsRequest* req) except -1:
        """constructLimitsToCheck: each descriptor's node (NULL: none) into
        self.nodes, its share_threshold patterns into self.shares; the
        names the matched nodes replace into self.replacing."""
        cdef uint32_t i, j, share_at = 0
        cdef const CNode* node
        cdef const RlsDescriptor* d
        self.nreplacing = 0
        for i in range(req.ndescriptors):
            d = &req.descriptors[i]
            if d.has_override:
                if d.override_unit < 1 or d.override_unit > 7:
                    raise RlsError(f"invalid rate limit unit {d.override_unit} in the "
                                   "descriptor's limit")
                self.nodes[i] = NULL
                continue
            node = self.find(dom.root, d, self.shares + share_at)
            share_at += d.nentries
            self.nodes[i] = node
            if node != NULL and node.nreplaces:
                grow(<void**>&self.replacing, &self.replacing_cap,
                     self.nreplacing + node.nreplaces, sizeof(int32_t))
                for j in range(node.nreplaces):
                    self.replacing[self.nreplacing] = node.replaces[j]
                    self.nreplacing += 1
        return 0

    cdef const CNode* find(self, const CNode* root, const RlsDescriptor* d,
                           Slice* shares) except? NULL:
        """GetLimit: the node the descriptor lands on (with limits), or
        NULL; a matched share_threshold's pattern in shares[i] for entry
        i (the others' n = SIZE_MAX... none: p NULL)."""
        cdef const CNode* node = root
        cdef const CNode* child
        cdef const CNode* found = NULL
        cdef uint32_t i, w
        cdef const RlsEntry* e
        cdef size_t n
        for i in range(d.nentries):
            shares[i].p = NULL
        for i in range(d.nentries):
            e = &d.entries[i]
            n = e.key.n + 1 + e.value.n
            self.key_room(n)
            memcpy(self.key, e.key.p, e.key.n)
            self.key[e.key.n] = 95      # '_'
            memcpy(self.key + e.key.n + 1, e.value.p, e.value.n)
            child = NULL
            if node.has_children:
                child = lookup(node.slots, node.mask, self.key, n).node
            if child == NULL:
                for w in range(node.nwild):
                    if wildcard_match(&node.wild[w], self.key, n):
                        child = node.wild[w].node
                        if child.has_share:
                            shares[i] = child.share_pattern
                        break
            if child == NULL and node.has_children:
                child = lookup(node.slots, node.mask, e.key.p, e.key.n).node
            if child == NULL:
                break
            if i == d.nentries - 1 and child.has_limits:
                found = child
            if not child.has_children:
                break
            node = child
        return found

    cdef int key_room(self, size_t n) except -1:
        return grow(<void**>&self.key, &self.key_cap, n, 1, 256)

    cdef bint replaced(self, const CLimit* lim) noexcept:
        cdef uint32_t i
        if lim.name_id < 0:
            return False
        for i in range(self.nreplacing):
            if self.replacing[i] == lim.name_id:
                return True
        return False

    cdef size_t bucket_key(self, const CDomain* dom, const RlsDescriptor* d,
                           const Slice* shares) except? 0:
        """The descriptor's part of its buckets' keys (a limit's index
        follows) in self.key: length-prefixed, so no two descriptors share
        one by accident; a share_threshold entry's pattern for its value
        (shares NULL: none)."""
        cdef size_t n = dom.name.n + 24, at
        cdef uint32_t i
        cdef Slice v
        for i in range(d.nentries):
            n += d.entries[i].key.n + d.entries[i].value.n + 48
            if shares != NULL and shares[i].p != NULL:
                n += shares[i].n
        self.key_room(n + 24)
        at = put_field(self.key, dom.name.p, dom.name.n)
        for i in range(d.nentries):
            v = shares[i] if shares != NULL and shares[i].p != NULL else d.entries[i].value
            at += put_field(self.key + at, d.entries[i].key.p, d.entries[i].key.n)
            at += put_field(self.key + at, v.p, v.n)
        return at

    cdef int check_home(self, const CDomain* dom, const RlsRequest* req) except -1:
        """RlsHome for the first home limit matched whose descriptor lives
        in another region (its "home", else the descriptor key's hash
        over the regions, as a home rule's client key)."""
        cdef uint32_t i, j, share_at = 0
        cdef const CNode* node
        cdef const CLimit* lim
        cdef int home
        cdef size_t n
        for i in range(req.ndescriptors):
            node = self.nodes[i]
            if node != NULL and not node.unlimited:
                for j in range(node.nlimits):
                    lim = &node.limits[j]
                    if lim.home == HOME_NOT or self.replaced(lim):
                        continue
                    home = lim.home
                    if home == HOME_HASH:
                        n = self.bucket_key(dom, &req.descriptors[i], self.shares + share_at)
                        home = home_index(PyBytes_FromStringAndSize(self.key, n),
                                          self.region_count)
                    if home != self.region_here:
                        raise RlsHome(home)
            if not req.descriptors[i].has_override:
                share_at += req.descriptors[i].nentries
        return 0

    cdef int count(self, const CDomain* dom, const RlsRequest* req, RlsOutcome* out) except -1:
        """Every descriptor's limits counted (or, atomic, read, and spent
        only if the request passes), the statuses and statistics."""
        cdef uint32_t i, j, share_at = 0
        cdef uint32_t quota_total = 0, quota_over = 0
        cdef const CNode* node
        cdef const CLimit* lim
        cdef const CLimit* best_limit = NULL
        cdef const RlsDescriptor* d
        cdef RlsStatus st, best
        cdef DomainStat* stats = &self.compiled.domain_stats[dom.stat]
        cdef int64_t now_ms = self.engine.clock.now_ms()
        cdef bint atomic = dom.atomic, any_limit
        cdef size_t base
        self.commits_len = 0
        stats.calls += 1
        for i in range(req.ndescriptors):
            d = &req.descriptors[i]
            st.code = RLS_OK
            if d.has_override:
                self.override_limit(d)
                base = self.bucket_key(dom, d, NULL)
                self.step(base, &self.override, self.hits[i], now_ms, atomic, &st)
                best, best_limit = st, &self.override
                any_limit = True
            else:
                node = self.nodes[i]
                any_limit = False
                if node != NULL and not node.unlimited:
                    base = 0
                    for j in range(node.nlimits):
                        lim = &node.limits[j]
                        if self.replaced(lim):
                            continue
                        if not any_limit:
                            base = self.bucket_key(dom, d, self.shares + share_at)
                        self.step(base, lim, self.hits[i], now_ms, atomic, &st)
                        if not any_limit or tighter(&st, &best):
                            best, best_limit = st, lim
                        any_limit = True
                share_at += d.nentries
                if not any_limit:
                    no_match(&out.statuses[i])
                    if node != NULL and node.unlimited:
                        out.statuses[i].remaining = MAX_UINT32
                    continue
            if out.chosen < 0 or tighter(&best, &out.chosen_status):
                out.chosen = i
                out.chosen_status = best
                out.chosen_limit = best_limit if best_limit != &self.override else NULL
                out.chosen_descriptor = i
            if best.code == RLS_OVER_LIMIT:
                stats.limits_over += 1
                if best_limit.shadow:
                    stats.shadow += 1
                    if best_limit.stat >= 0:
                        self.compiled.limit_stats[best_limit.stat].shadow_mode += self.hits[i]
                    best.code = RLS_OK
            out.statuses[i] = best
            if best_limit.quota:
                quota_total += 1
                quota_over += best.code == RLS_OVER_LIMIT
            elif best.code == RLS_OVER_LIMIT:
                out.overall = RLS_OVER_LIMIT
        if quota_total and quota_total == quota_over:
            out.overall = RLS_OVER_LIMIT
        if atomic:
            self.settle(out, req.ndescriptors)
        if out.overall == RLS_OVER_LIMIT and self.shadow_mode:
            # after counting, as shouldRateLimitWorker does: the statuses
            # still say which descriptors are over
            out.overall = RLS_OK
            self.global_shadow_mode += 1
        if out.overall == RLS_OVER_LIMIT:
            stats.over_limit += 1
        return 0

    cdef int override_limit(self, const RlsDescriptor* d) except -1:
        """Envoy's descriptor `limit` as a limit of its own (no shadow mode,
        no name, no statistics): a fixed window of its unit."""
        self.override.rpu = d.override_rpu
        self.override.unit = d.override_unit
        self.override.name.p = ""
        self.override.name.n = 0
        self.override.algorithm = ALG_FIXED
        self.override.window_s = UNIT_SECONDS[d.override_unit]
        self.override.index = 0
        self.override.counter = -1
        self.override.name_id = -1
        self.override.home = HOME_NOT
        self.override.stat = -1
        return 0

    cdef int step(self, size_t base, const CLimit* lim, uint64_t hits_u, int64_t now_ms,
                  bint atomic, RlsStatus* st) except -1:
        """One limit's count on the bucket self.key[:base] + its index."""
        cdef uint32_t num
        cdef size_t n = base + put_decimal(self.key + base, lim.index)
        cdef int64_t hits = <int64_t>hits_u
        cdef int64_t cost = 0 if atomic else hits
        cdef int64_t at_ms = now_ms, window_ms, after, before, left, wait, reset_s
        cdef int64_t rpu = lim.rpu, remaining, now_s = now_ms // 1000
        cdef bint over, allowed
        cdef CheckResult r
        cdef int rc
        if lim.counter >= 0:
            num = self.compiled.nums[lim.counter]
        else:
            num = self.service.override_number(lim.window_s)
        if lim.algorithm == ALG_FIXED:
            window_ms = lim.window_s * 1000
            at_ms = now_ms - now_ms % window_ms + window_ms - 1
        rc = self.engine.apply_one(num, self.key, n, cost, at_ms, &r)
        if rc != FL_OK:
            raise RlsError("descriptor too long: its key must be at most 65535 bytes")
        allowed = r.allowed
        remaining = r.remaining
        if lim.algorithm == ALG_FIXED:
            after = C_COUNTER_LIMIT - remaining + (hits if cost == 0 or not allowed else 0)
            over = after > rpu
            left = 0 if over else rpu - after
            reset_s = lim.window_s - now_s % lim.window_s
            before = after - hits
        else:
            over = not allowed if not atomic else remaining < hits
            left = 0 if over else (remaining - hits if atomic else remaining)
            wait = r.retry_after_ms if over and r.retry_after_ms > 0 else r.reset_after_ms
            reset_s = max(1, (wait + 999) // 1000) if wait >= 0 else lim.window_s
            before = rpu - remaining - (hits if allowed and cost else 0)
            if before < 0:
                before = 0
        if atomic and not over and hits:
            self.note_commit(num, n, hits, at_ms)
        if lim.stat >= 0 and hits:
            count_limit(&self.compiled.limit_stats[lim.stat], rpu, before, hits, over)
        st.code = RLS_OVER_LIMIT if over else RLS_OK
        st.has_limit = True
        st.rpu = lim.rpu
        st.unit = lim.unit
        st.name = lim.name
        st.remaining = <uint64_t>left
        st.reset_s = reset_s
        return 0

    cdef int note_commit(self, uint32_t num, size_t n, int64_t hits, int64_t at_ms) except -1:
        """An atomic request's spend, made only if the whole request passes:
        <u32 num><u32 n><i64 hits><i64 at_ms><the key>."""
        cdef size_t need = self.commits_len + 24 + n
        cdef char* p
        grow(<void**>&self.commits, &self.commits_cap, need, 1, 1024)
        p = self.commits + self.commits_len
        memcpy(p, &num, 4)
        memcpy(p + 4, &n, 4)
        memcpy(p + 8, &hits, 8)
        memcpy(p + 16, &at_ms, 8)
        memcpy(p + 24, self.key, n)
        self.commits_len = need
        return 0

    cdef int settle(self, RlsOutcome* out, uint32_t ndescriptors) except -1:
        """An atomic request: its spends made if it passed; else nothing was
        spent, and what passed shows what is left unspent."""
        cdef size_t at = 0
        cdef uint32_t num, n, i
        cdef int64_t hits, at_ms
        cdef CheckResult r
        cdef RlsStatus* s
        if out.overall == RLS_OK:
            while at < self.commits_len:
                memcpy(&num, self.commits + at, 4)
                memcpy(&n, self.commits + at + 4, 4)
                memcpy(&hits, self.commits + at + 8, 8)
                memcpy(&at_ms, self.commits + at + 16, 8)
                if self.engine.apply_one(num, self.commits + at + 24, n, hits, at_ms,
                                         &r) != FL_OK:
                    raise RlsError("descriptor too long: its key must be at most 65535 bytes")
                at += 24 + n
            return 0
        for i in range(ndescriptors):
            s = &out.statuses[i]
            if s.code == RLS_OK and s.has_limit:
                s.remaining = min(s.remaining + self.hits[i], <uint64_t>s.rpu)
        return 0

    # ---- Python's side -----------------------------------------------------------

    def should_rate_limit(self, bytes domain, list descriptors, hits_addend):
        """(overall_code, statuses, response_headers_to_add) for Python
        callers (/json, CL.RLS, CL.REGIONCHECK): descriptors are
        [(entries [(key, value)], (requests_per_unit, unit) or None,
        hits_addend or None)]; RlsError or RlsHome."""
        cdef RlsRequest req
        cdef RlsOutcome out
        cdef uint32_t i, j, total = 0
        cdef RlsEntry* entries
        cdef RlsDescriptor* ds
        for entries_py, _, _ in descriptors:
            total += len(entries_py)
        ds = <RlsDescriptor*>calloc(len(descriptors) + 1, sizeof(RlsDescriptor))
        entries = <RlsEntry*>calloc(total + 1, sizeof(RlsEntry))
        if ds == NULL or entries == NULL:
            free(ds)
            free(entries)
            raise MemoryError()
        try:
            req.domain.p = PyBytes_AS_STRING(domain)
            req.domain.n = len(domain)
            req.hits_addend = min(max(0, hits_addend), 2**64 - 1)
            req.descriptors = ds
            req.ndescriptors = len(descriptors)
            total = 0
            for i, (entries_py, override, hits) in enumerate(descriptors):
                ds[i].entries = entries + total
                ds[i].nentries = len(entries_py)
                for j, (k, v) in enumerate(entries_py):
                    entries[total + j].key.p = PyBytes_AS_STRING(k)
                    entries[total + j].key.n = len(k)
                    entries[total + j].value.p = PyBytes_AS_STRING(v)
                    entries[total + j].value.n = len(v)
                total += len(entries_py)
                if override is not None:
                    ds[i].has_override = True
                    ds[i].override_rpu = override[0]
                    ds[i].override_unit = override[1]
                if hits is not None:
                    ds[i].has_hits = True
                    ds[i].hits = min(max(0, hits), 2**64 - 1)
            self.decide(&req, &out)
            return out.overall, self.statuses_of(&out), self.headers_of(&self.last, &out)
        finally:
            free(ds)
            free(entries)

    cdef list statuses_of(self, const RlsOutcome* out):
        cdef uint32_t i
        cdef const RlsStatus* s
        result = []
        for i in range(out.n):
            s = &out.statuses[i]
            result.append((s.code, (s.rpu, s.unit, PyBytes_FromStringAndSize(s.name.p, s.name.n))
                           if s.has_limit else None, s.remaining, s.reset_s))
        return result

    cdef list headers_of(self, const RlsRequest* req, const RlsOutcome* out):
        """The response headers: x-fastlimit-shed for a shed request; with
        response_headers, the IETF RateLimit-Policy and RateLimit fields
        of the most restrictive status (an over-limit one first, then the
        fewest remaining), as the HTTP front writes them, and Retry-After
        when the request is refused."""
        cdef const RlsStatus* st = &out.chosen_status
        if out.shed:
            return [SHED_HEADER]
        if not self.response_headers or out.chosen < 0:
            return []
        name = sf_string(self.chosen_name(req, out))
        window_s = out.chosen_limit.window_s if out.chosen_limit != NULL else \
            UNIT_SECONDS[st.unit]
        result = [(b"RateLimit-Policy", f"{name};q={st.rpu};w={window_s}".encode()),
                  (b"RateLimit", f"{name};r={st.remaining};t={st.reset_s}".encode())]
        if out.overall == RLS_OVER_LIMIT:
            result.append((b"Retry-After", str(max(1, st.reset_s)).encode()))
        return result

    cdef str chosen_name(self, const RlsRequest* req, const RlsOutcome* out):
        """The chosen limit's name, else its full key (an override's:
        domain.key_value.key of its descriptor)."""
        cdef const CLimit* lim = out.chosen_limit
        cdef const RlsDescriptor* d
        cdef uint32_t i
        if lim != NULL:
            s = lim.name if lim.name.n else lim.full_key
            return PyBytes_FromStringAndSize(s.p, s.n).decode("utf-8", "replace")
        d = &req.descriptors[out.chosen_descriptor]
        parts = []
        for i in range(d.nentries):
            k = PyBytes_FromStringAndSize(d.entries[i].key.p, d.entries[i].key.n)
            v = PyBytes_FromStringAndSize(d.entries[i].value.p, d.entries[i].value.n)
            parts.append((k + b"_" + v if v else k).decode("utf-8", "replace"))
        return PyBytes_FromStringAndSize(req.domain.p, req.domain.n).decode(
            "utf-8", "replace") + "." + ".".join(parts)

    def stats_info(self):
        """{domain name: {calls, over_limit, shadow, limits_over}}."""
        return {name.decode("utf-8", "replace"): s
                for name, s in self.compiled.domain_stat_items()}


class _EmptyConfig:
    domains: dict = {}


cdef tuple request_objects(const RlsRequest* req):
    """req as Python objects: (domain, [(entries [(key, value)],
    (requests_per_unit, unit) or None, hits_addend or None)], hits_addend),
    as should_rate_limit and the regions' link take it."""
    cdef uint32_t i, j
    cdef const RlsDescriptor* d
    descriptors = []
    for i in range(req.ndescriptors):
        d = &req.descriptors[i]
        entries = [(PyBytes_FromStringAndSize(d.entries[j].key.p, d.entries[j].key.n),
                    PyBytes_FromStringAndSize(d.entries[j].value.p, d.entries[j].value.n))
                   for j in range(d.nentries)]
        descriptors.append((entries, (d.override_rpu, d.override_unit) if d.has_override
                            else None, d.hits if d.has_hits else None))
    return (PyBytes_FromStringAndSize(req.domain.p, req.domain.n), descriptors,
            req.hits_addend)
