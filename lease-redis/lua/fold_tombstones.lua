-- KEYS[1]: the namespace's tombstones as an older release kept them (a hash: purged id -> its
-- last fence), or this release's marker in their place; KEYS[2]: the fence floor
-- ARGV[1]: the HSCAN cursor to continue from ('0' to start); ARGV[2]: this release's format
-- number; ARGV[3]: its marker ('format <number>: what it means')
-- Returns: {'newer', marker} (nothing written: a later release wrote the namespace, whose
-- records this release may misread); or {cursor, wrote}: the cursor to call again with, or
-- 'done' once the tombstones are folded and the marker is set; wrote is 1 if this call folded
-- tombstones (replicas must confirm it before the store serves: a create reads the floor
-- alone), 0 if not (setting or raising the marker needs no confirmation: lost, it is set again
-- by the next connect).
-- Moves a page of tombstones into the floor (the floor rises to their highest fence) and
-- deletes them. Once none is left, KEYS[1] becomes a string: a process of the older release
-- still running against the namespace then fails its create and purge (WRONGTYPE) instead of
-- starting a purged id below its last fence.
local kind = redis.call('TYPE', KEYS[1]).ok
local folded = '0'
if kind == 'hash' then
  folded = '1'
  local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', 500)
  local floor = redis.call('GET', KEYS[2]) or '0'
  local fields = page[2]
  for i = 1, #fields, 2 do
    floor = fence_max(floor, fields[i + 1])
    redis.call('HDEL', KEYS[1], fields[i])
  end
  redis.call('SET', KEYS[2], floor)
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return { page[1], '1' } -- '0' again when the scan ended with fields written meanwhile
  end
elseif kind == 'string' then
  -- The format marker: a later release's is refused, an earlier one's raised to this one's
  -- (every earlier format reads as this one: a class without a queue is the default queue's; a
-- record without the flag 't' has no trace parent).
  local marker = redis.call('GET', KEYS[1])
  local format = tonumber(string.match(marker, '^format (%d+):') or '0')
  if format > tonumber(ARGV[2]) then
    return { 'newer', marker }
  end
  if format < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[1], ARGV[3])
  end
  return { 'done', '0' }
elseif kind ~= 'none' then
  return redis.error_reply('the key ' .. KEYS[1] .. ' is a ' .. kind .. '; this store keeps its format marker there')
end
redis.call('SET', KEYS[1], ARGV[3])
return { 'done', folded }
