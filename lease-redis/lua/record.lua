-- The run record and the attempt history, written once for every script: common.lua's helpers
-- and the hot scripts (claim, renew, fenced), which run without common.lua, use these, so the
-- formats have one reader and one writer. Put before every script, after the rendered limits
-- (src/call.rs).

-- A run record: state, fence, heartbeats, expiry ('' for none), claimable member, owner ('' for
-- none), then the times and facts (common.lua describes them).
local RECORD = '^(%l+):(%d+):(%d+):(%d*):(%x+):([^\1]*)(.*)$'

-- A decimal string plus one, exactly, at any length.
local function decimal_succ(d)
  if #d < 16 then
    return string.format('%d', d + 1) -- exact as a number below 2^53, and cheaper
  end
  local i = #d
  while i > 0 and string.byte(d, i) == 57 do
    i = i - 1
  end
  if i == 0 then
    return '1' .. string.rep('0', #d)
  end
  return string.sub(d, 1, i - 1) .. string.char(string.byte(d, i) + 1) .. string.rep('0', #d - i)
end

-- Whether the last attempt in the history hash `hist` of run `id` was ended under `fence` by
-- the call `call` (its eighth field, as common.lua's push_attempt writes it): a resend of that
-- call.
local function ended_by(hist, id, fence, call)
  local last = string.match(redis.call('HGET', hist, id) or '', '([^\30]*)$')
  return string.match(last, '^%d*\31(%d+)\31') == fence and string.match(last, '\31([^\31]*)$') == call
end

-- The history `old` (false or nil for none: attempts separated by byte 30) with `entry` at its
-- end, the oldest dropped past MAX_HISTORY.
local function history_with(old, entry)
  if not old then
    return entry
  end
  local _, seps = string.gsub(old, '\30', '')
  if seps >= MAX_HISTORY - 1 then
    old = string.sub(old, string.find(old, '\30', 1, true) + 1)
  end
  return old .. '\30' .. entry
end


-- Waits for a signal (lease_core::signal). The wait hash keeps a suspended run's wait, field
-- id: 'fence:deadline:name' (the fence of the lease that began it; the deadline in µs on the
-- server clock, '' for none; the name, which holds no control character, to the end). The
-- deadlines zset scores the id of each wait with a deadline by it (for count), and the run's
-- member in its class's claimable index is scored by it too: claim_next meets the run when its
-- wait times out. The resumed hash keeps how the run's last wait ended until it waits again,
-- field id: 'S:fence:at:name' then byte 31 and the signal's payload (binary, to the end), or
-- 'T:fence:deadline:name' for a timeout. A record flagged 'w' (common.lua's facts) has waited:
-- only such a run has a resumed field to read.
local WAIT = '^(%d+):(%d*):(.*)$'

-- The wait of run `id` in the wait hash `waits` if the run waits for a signal and its
-- deadline has passed at `now`: its fence, deadline and name; else nil.
local function wait_due(waits, id, now)
  local wf, wd, wn = string.match(redis.call('HGET', waits, id) or '', WAIT)
  if wd and wd ~= '' and tonumber(wd) <= now then
    return wf, wd, wn
  end
  return nil
end

-- A claim of a run whose wait (fence `wf`, deadline `wd`, name `wn`) timed out: the wait ends
-- timed out (KEYS given: the wait hash, deadlines zset, resumed hash, suspended zset and
-- attempts hash), with a fresh attempt budget; the caller then claims the run as runnable.
-- Returns the resumed field, which the claim's lease carries.
local function time_out(waits, deadlines, resumed, suspended, attempts, id, wf, wd, wn)
  local ended = 'T:' .. wf .. ':' .. wd .. ':' .. wn
  redis.call('HSET', resumed, id, ended)
  redis.call('HDEL', waits, id)
  redis.call('ZREM', deadlines, id)
  redis.call('ZREM', suspended, id)
  redis.call('HSET', attempts, id, '0')
  return ended
end
