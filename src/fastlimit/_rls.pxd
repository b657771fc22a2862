# Envoy's rate limit service's decision in C: a configuration's descriptor
# trees compiled into C structures once per load (Compiled), and the
# decision (Decider.decide) over a request held as slices of its message,
# which walks them with no Python object per descriptor or entry.  The
# gRPC front decodes a RateLimitRequest straight into an RlsRequest and
# writes the RlsOutcome as its RateLimitResponse; /json, CL.RLS and the
# regions' CL.REGIONCHECK go through Decider.should_rate_limit, which packs
# Python objects into the same structures.  rls/service.py is the
# configuration's side (the engine rules' numbers, the reloads).

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from fastlimit._load cimport LoadMeter
from fastlimit._rules cimport RuleEngine


cdef struct CNode
cdef struct Child
cdef struct Wild


cdef struct Slice:
    const char* p
    size_t n


cdef struct RlsEntry:
    Slice key
    Slice value


cdef struct RlsDescriptor:
    RlsEntry* entries
    uint32_t nentries
    bint has_override           # Envoy's descriptor `limit`
    uint32_t override_rpu
    int32_t override_unit
    bint has_hits               # the descriptor's own hits_addend
    uint64_t hits


cdef struct RlsRequest:
    Slice domain
    RlsDescriptor* descriptors
    uint32_t ndescriptors
    uint64_t hits_addend


cdef enum:
    RLS_OK = 1
    RLS_OVER_LIMIT = 2
    ALG_FIXED = 0               # rls/config.py ALGORITHMS' order
    HOME_NOT = -1               # CLimit.home: not a home limit
    HOME_HASH = -2              # the descriptor's hash picks its home


# One limit of a node, as the response reports it and the engine counts it.
cdef struct CLimit:
    uint32_t rpu
    uint32_t unit
    Slice name
    Slice full_key              # "domain.key_value.key", the stats' and headers' name
    bint shadow
    bint quota
    int algorithm               # an index of ALGORITHMS
    int64_t window_s
    uint32_t index              # which limit of its node: its bucket key's suffix
    int32_t counter             # Compiled.nums' index (-1: an override's, found per call)
    int32_t name_id             # its name among the names `replaces` uses (-1: none)
    int32_t home                # a home limit's region, HOME_HASH or HOME_NOT
    int32_t stat                # Compiled.limit_stats' index (-1: none)


cdef struct CNode:
    Child* slots                # open addressing, by the reference's composite key
    uint32_t mask               # slots - 1 (slots is a power of two, 0 when none)
    bint has_children
    Wild* wild                  # wildcard children in load order
    uint32_t nwild
    CLimit* limits              # the limits that count (not unlimited)
    uint32_t nlimits
    bint has_limits             # any limit, unlimited ones too: a descriptor ends here
    bint unlimited
    int32_t* replaces           # name ids its limits replace
    uint32_t nreplaces
    bint has_share
    Slice share_pattern


cdef struct Child:
    uint64_t hash
    Slice key
    CNode* node


cdef struct Wild:
    Slice* parts                # the pattern split on '*'
    uint32_t nparts
    size_t min_len
    CNode* node


cdef struct LimitStat:
    uint64_t total_hits
    uint64_t within_limit
    uint64_t near_limit
    uint64_t over_limit
    uint64_t shadow_mode


cdef struct DomainStat:
    uint64_t calls
    uint64_t over_limit
    uint64_t shadow
    uint64_t limits_over


cdef struct CDomain:
    Slice name
    CNode* root
    bint atomic
    int32_t stat


# One descriptor's answer: (code, current_limit or none, remaining, reset).
cdef struct RlsStatus:
    int code
    bint has_limit
    uint32_t rpu
    uint32_t unit
    Slice name
    uint64_t remaining
    int64_t reset_s


cdef struct RlsOutcome:
    int overall
    uint32_t n
    RlsStatus* statuses
    bint shed                   # the request was shed (x-fastlimit-shed: 1)
    # the status the RateLimit headers describe (-1: none), as counted
    # before shadow mode and an atomic request's refund changed it
    int32_t chosen
    RlsStatus chosen_status
    const CLimit* chosen_limit  # NULL: an override (its name is made then)
    uint32_t chosen_descriptor


cdef class Compiled:
    cdef void** chunks          # the arena's chunks, freed with the object
    cdef size_t nchunks
    cdef size_t chunks_cap
    cdef char* chunk_at         # the current chunk's free part
    cdef size_t chunk_left
    cdef uint64_t work           # pieces of work done building it (breathe())
    cdef CDomain* domains
    cdef uint32_t ndomains
    cdef Child* domain_slots
    cdef uint32_t domain_mask
    cdef readonly list counters  # counter keys by index: what nums holds the numbers of
    cdef uint32_t* nums
    cdef LimitStat* limit_stats
    cdef readonly list stat_keys  # (domain, full_key, index) by limit_stats' index
    cdef list stat_order          # limit_stats' indexes in stat_keys' order (made once)
    cdef DomainStat* domain_stats
    # carry_from(): each limit's and domain's index in the configuration
    # whose statistics it takes over (-1: none), and that configuration
    cdef int32_t* limit_from
    cdef int32_t* domain_from
    cdef object carried_from
    cdef readonly list domain_names
    cdef readonly bint has_home
    cdef void* alloc(self, size_t n) except NULL
    cdef Slice keep(self, bytes b) except *
    cdef CNode* node(self, root, tuple domain, list counters, dict counter_index, dict names,
                     list stat_keys, regions) except NULL
    cdef CNode* made(self, py, dict made, list todo) except NULL
    cdef int fill(self, CNode* c, py, tuple domain, list counters, dict counter_index,
                  dict names, list stat_keys, regions) except -1
    cdef const CDomain* domain(self, const char* p, size_t n) noexcept
    cdef void breathe(self) noexcept
    cdef list sorted_stats(self)


cdef class Decider:
    cdef Compiled compiled
    cdef RuleEngine engine
    cdef public object service  # rls/service.py RateLimitService: override numbers, read-only
    cdef public LoadMeter load
    cdef public object read_only
    cdef public bint response_headers
    cdef public bint shadow_mode
    cdef public bint home_local
    cdef public int region_here
    cdef public int region_count
    cdef readonly uint64_t unknown_domain
    cdef readonly uint64_t global_shadow_mode
    # per call scratch, grown as needed
    cdef RlsStatus* statuses
    cdef size_t status_cap
    cdef const CNode** nodes
    cdef uint64_t* hits
    cdef Slice* shares
    cdef size_t desc_cap
    cdef size_t share_cap
    cdef int32_t* replacing
    cdef size_t replacing_cap
    cdef uint32_t nreplacing
    cdef RlsRequest last        # the request as decided (without its priority entries)
    cdef char* key
    cdef size_t key_cap
    cdef char* commits
    cdef size_t commits_len
    cdef size_t commits_cap
    cdef RlsEntry* entries
    cdef size_t entries_cap
    cdef RlsDescriptor* kept
    cdef size_t kept_cap
    cdef CLimit override

    cdef int decide(self, const RlsRequest* request, RlsOutcome* out) except -1
    cdef int reserve(self, const RlsRequest* req) except -1
    cdef int take_priority(self, RlsRequest* req) except -1
    cdef bint spent(self, const RlsRequest* req) noexcept
    cdef int match(self, const CDomain* dom, const RlsRequest* req) except -1
    cdef const CNode* find(self, const CNode* root, const RlsDescriptor* d,
                           Slice* shares) except? NULL
    cdef int key_room(self, size_t n) except -1
    cdef bint replaced(self, const CLimit* lim) noexcept
    cdef size_t bucket_key(self, const CDomain* dom, const RlsDescriptor* d,
                           const Slice* shares) except? 0
    cdef int check_home(self, const CDomain* dom, const RlsRequest* req) except -1
    cdef int count(self, const CDomain* dom, const RlsRequest* req, RlsOutcome* out) except -1
    cdef int override_limit(self, const RlsDescriptor* d) except -1
    cdef int step(self, size_t base, const CLimit* lim, uint64_t hits_u, int64_t now_ms,
                  bint atomic, RlsStatus* st) except -1
    cdef int note_commit(self, uint32_t num, size_t n, int64_t hits, int64_t at_ms) except -1
    cdef int settle(self, RlsOutcome* out, uint32_t ndescriptors) except -1
    cdef list statuses_of(self, const RlsOutcome* out)
    cdef list headers_of(self, const RlsRequest* req, const RlsOutcome* out)
    cdef str chosen_name(self, const RlsRequest* req, const RlsOutcome* out)


cdef tuple request_objects(const RlsRequest* req)
cdef int fl_room(void** p, size_t* cap, size_t need, size_t size, size_t first) noexcept nogil
