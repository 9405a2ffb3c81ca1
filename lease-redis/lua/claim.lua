-- KEYS[1]: runs hash; KEYS[2]: claimable index (zset) of the kind ARGV[4]; KEYS[3]: attempts
-- hash; KEYS[4]: payloads hash; KEYS[5]: kinds hash (id -> kind, for kinds other than the
-- default); KEYS[6]: history hash (a claim that takes over an expired lease writes that
-- attempt, ended at its expiry, as common.lua's push_attempt does); KEYS[7]: the restore
-- marker (src/epoch.rs); KEYS[8]: the wait hash; KEYS[9]: the deadlines zset; KEYS[10]: the
-- resumed hash; KEYS[11]: suspended runs (zset) (record.lua describes the three for waits)
-- ARGV[1]: encoded run id; ARGV[2]: worker id; ARGV[3]: TTL in milliseconds; ARGV[4]: the kind
-- the client presumes the run is of ('' for the default)
-- Returns: {'restored', marker} (nothing written: the namespace was restored and is not
-- rebound yet); {'none'}; {'refused', state, owner, expiry, fence, now}; {'kind', actual} (nothing
-- written: send again with the index of the run's actual kind); or {'ok', fence, expiry,
-- attempts, payload, resumed, trace parent} (every claim counts against the attempt budget; a
-- voluntary end gives it back; the payload: its bytes, or nil for none; resumed: how the run's
-- last wait ended, its resumed field as record.lua writes it, or nil for none; the trace
-- parent: its text, field 't:' and the id in the payloads hash, or nil for none)
-- A run suspended waiting for a signal whose deadline has passed is claimable: the claim ends
-- the wait timed out (record.lua's time_out) and takes the run as a runnable one.
-- A hot script, run without the common.lua prelude (whose helpers every call would build
-- again): the record's format and the history's come from record.lua, as common.lua's do.
local restored = redis.call('GET', KEYS[7])
if restored then
  return { 'restored', restored }
end
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return { 'none' }
end
local s, f, h, e, m, o, times = string.match(v, RECORD)
if not s then
  return redis.error_reply('malformed run record for ' .. ARGV[1])
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2] -- exact in a double until year 2255
-- string.format('%d', x) prints through a 64-bit integer: exact below 2^53, and cheaper than '%.0f'.
-- Claimable: runnable, unowned or expired, past any retry delay (an unowned run's expiry
-- field), and not at the last fence (i64::MAX).
local wf, wd, wn
if s == 'suspended' and f ~= '9223372036854775807' then
  wf, wd, wn = wait_due(KEYS[8], ARGV[1], now)
end
if not wf and (s ~= 'runnable' or (e ~= '' and tonumber(e) > now) or f == '9223372036854775807') then
  return { 'refused', s, o, e, f, string.format('%d', now) }
end
-- The record's facts (common.lua): its class, or the flag 'd', spares the kinds look-up, the
-- flag 'n' the payload's; without the flag 't' the run has no trace parent.
local created, facts = string.match(times, '^\1(%d*),%d*,%d*(.*)$')
local flags = facts and string.match(facts, '^\2(%l*)')
local kind = facts and string.match(facts, '\3(.*)$')
if not kind then
  if flags and string.find(flags, 'd', 1, true) then
    kind = ''
  else
    kind = redis.call('HGET', KEYS[5], ARGV[1]) or ''
  end
end
if kind ~= ARGV[4] then
  return { 'kind', kind }
end
-- How the run's last wait ended: this claim's timeout, or the resumed field of a run that has
-- waited (flag 'w').
local resumed = false
if wf then
  resumed = time_out(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[3], ARGV[1], wf, wd, wn)
elseif flags and string.find(flags, 'w', 1, true) then
  resumed = redis.call('HGET', KEYS[10], ARGV[1])
end
if o ~= '' then
  -- An expired lease taken over: its attempt ended at its expiry.
  local entry = (redis.call('HGET', KEYS[3], ARGV[1]) or '0') .. '\31' .. f .. '\31' .. o .. '\31'
    .. (string.match(times, '^\1%d*,(%d*)') or '') .. '\31' .. e .. '\31expired\31'
  redis.call('HSET', KEYS[6], ARGV[1], history_with(redis.call('HGET', KEYS[6], ARGV[1]), entry))
end
f = decimal_succ(f)
local expires = string.format('%d', now + ARGV[3] * 1000)
-- Claimed now, not renewed since; the creation time stays.
redis.call('HSET', KEYS[1], ARGV[1], 'runnable:' .. f .. ':' .. h .. ':' .. expires .. ':' .. m .. ':' .. ARGV[2]
  .. '\1' .. (created or '') .. ',' .. string.format('%d', now) .. ',' .. (facts or ''))
if f == '9223372036854775807' then
  redis.call('ZREM', KEYS[2], m) -- never claimable again
else
  redis.call('ZADD', KEYS[2], expires, m)
end
-- The payload: its bytes, or false (a nil reply) for none.
local payload = false
if not (flags and string.find(flags, 'n', 1, true)) then
  payload = redis.call('HGET', KEYS[4], ARGV[1])
end
-- The trace parent: its text if the record is flagged 't', else false (a nil reply) for none.
local trace = false
if flags and string.find(flags, 't', 1, true) then
  trace = redis.call('HGET', KEYS[4], 't:' .. ARGV[1])
end
return { 'ok', f, expires, tostring(redis.call('HINCRBY', KEYS[3], ARGV[1], 1)), payload, resumed,
  trace }
