-- The reference token bucket of the brief, as teams run it in Redis today.
-- KEYS[1] = bucket key
-- ARGV = capacity, refill_per_sec, cost [, now_ms]
-- Returns {allowed, limit, remaining, retry_after_ms, reset_after_ms},
-- the same five integers as fastlimit's CL.CHECK.
--
-- Tokens are integer milli-tokens; refill_per_sec tokens per second is
-- refill_per_sec milli-tokens per millisecond.  Lua numbers are doubles,
-- exact for the integers used here (below 2^53).
--
-- Without now_ms the server's TIME is used and the key expires (PEXPIRE)
-- when the bucket would be full again.  With an explicit now_ms (the
-- differential tests drive logical time) real-time expiry would fire at
-- the wrong moment, so a full bucket is deleted instead, which is the same
-- thing: a full bucket is indistinguishable from no bucket.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local logical_time = now ~= nil
if not logical_time then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local cap_m = capacity * 1000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'last')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = cap_m
  last = now
end

local elapsed = math.max(0, now - last)
tokens = math.min(cap_m, tokens + elapsed * rate)
last = now

local allowed, retry = 0, 0
if cost > capacity then
  retry = -1
elseif tokens >= cost * 1000 then
  tokens = tokens - cost * 1000
  allowed = 1
else
  retry = math.ceil((cost * 1000 - tokens) / rate)
end
local reset = math.ceil((cap_m - tokens) / rate)

if tokens >= cap_m then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'last', last)
  if logical_time then
    redis.call('PEXPIRE', KEYS[1], 3600000)
  else
    redis.call('PEXPIRE', KEYS[1], reset)
  end
end
return {allowed, capacity, math.floor(tokens / 1000), retry, reset}
