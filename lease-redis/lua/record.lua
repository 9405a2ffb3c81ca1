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

