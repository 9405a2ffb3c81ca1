-- Shared helpers, prepended to every script of this crate (not a script by itself).
-- KEYS[1]: none (each script declares its own keys below this prelude)
-- ARGV[1]: none
-- Returns: nothing; defines local helpers.
--
-- A run hash holds: s = state, o = owner ('' or absent when unowned), e = expiry in
-- microseconds on the server clock, f = fence (decimal string, never a Lua number, so values
-- above 2^53 stay exact), h = heartbeats, m = the run's member in the claimable index.
local FENCE_MAX = '9223372036854775807'

-- The server clock in microseconds since the Unix epoch (exact in a double until year 2255).
local function now_micros()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integral Lua number as a decimal string (tostring would use exponent notation).
local function num(n)
  return string.format('%.0f', n)
end

local function read_run(key)
  local v = redis.call('HMGET', key, 's', 'o', 'e', 'f', 'h', 'm')
  if not v[1] then
    return nil
  end
  return { s = v[1], o = v[2] or '', e = v[3] or '', f = v[4], h = v[5], m = v[6] }
end

-- Runnable, unowned or expired, and not at the last fence.
local function claimable(r, now)
  return r.s == 'runnable' and (r.o == '' or tonumber(r.e) <= now) and r.f ~= FENCE_MAX
end

-- Whether a write under `presented` is allowed: same fence, runnable, owned.
local function held(r, presented)
  return r.f == presented and r.s == 'runnable' and r.o ~= ''
end

local function owned_flag(r)
  if r.o ~= '' then return '1' end
  return '0'
end

-- Puts the run in the claimable index at `at`, or takes it out when it can never be claimed.
local function index(zkey, r, fence, at)
  if fence == FENCE_MAX then
    redis.call('ZREM', zkey, r.m)
  else
    redis.call('ZADD', zkey, num(at), r.m)
  end
end

-- Claims the run: fence + 1, owner and expiry set, index moved to the expiry.
local function take(key, zkey, r, worker, expires)
  redis.call('HINCRBY', key, 'f', 1)
  local fence = redis.call('HGET', key, 'f')
  redis.call('HSET', key, 'o', worker, 'e', num(expires))
  index(zkey, r, fence, expires)
  return fence
end

-- The record as returned to Rust: state, owner, expiry, fence, heartbeats.
local function record(r)
  return { r.s, r.o, r.e, r.f, r.h }
end
