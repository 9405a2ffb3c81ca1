-- KEYS[1]: claimable index (zset); KEYS[2]: delayed runs (zset); KEYS[3]: suspended runs
-- (zset); KEYS[4]: ended runs (zset); KEYS[5]: failures hash (failed and cancelled runs);
-- KEYS[6]: cancelled runs (set); KEYS[7]: every kind but the default (set); KEYS[8..]: the
-- claimable index of each of those kinds; then the runs hash; then the deadlines zset (the
-- waits for a signal with a deadline, record.lua's)
-- ARGV[1]: how many kinds' indexes follow KEYS[7]; ARGV[2]: the most records of held or
-- delayed runs to read for the longest-held lease (lease_core::LONGEST_HELD_SCAN)
-- Returns: {'kinds'} when the kinds set holds another number of kinds than ARGV[1] (a kind was
-- added since the caller read it: read it again); else {claimable, held, delayed, suspended,
-- completed, failed, cancelled, lag, longest}, each from an index's size or a range count:
-- O(log n) per kind, whatever the number of runs; longest, how long ago in microseconds the
-- held run claimed earliest was claimed ('' for none), reads at most ARGV[2] records (this
-- store keeps no index by claim time). The claimable index holds
-- every runnable run, scored by when it is claimable (now or before: claimable; later: held
-- until its expiry, or delayed until its delay's end); a delayed run stays in the delayed set
-- after its delay, with a score that no longer counts. The index also holds the suspended runs
-- waiting for a signal until a deadline, scored by it (claim_next takes them then): they are
-- counted suspended, not claimable nor held, by the deadlines zset. lag is how long ago, in
-- microseconds, the longest-waiting claimable run became claimable (the lowest due score, a
-- timed-out wait's deadline included: claimable since), or '' for none.
if redis.call('SCARD', KEYS[7]) ~= tonumber(ARGV[1]) then
  return { 'kinds' }
end
local now = num(now_micros())
local claimable = 0
local later = 0
local oldest = nil -- the lowest due score: when the longest-waiting claimable run became so
for i = 0, tonumber(ARGV[1]) do
  local zkey = KEYS[1]
  if i > 0 then
    zkey = KEYS[7 + i]
  end
  local due = redis.call('ZCOUNT', zkey, '-inf', now)
  claimable = claimable + due
  if due > 0 then
    local first = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
    local score = tonumber(first[2])
    if oldest == nil or score < oldest then
      oldest = score
    end
  end
  later = later + redis.call('ZCARD', zkey) - due
end
local deadlines = KEYS[9 + tonumber(ARGV[1])]
local timed_out = redis.call('ZCOUNT', deadlines, '-inf', now)
claimable = math.max(claimable - timed_out, 0)
later = later - (redis.call('ZCARD', deadlines) - timed_out)
local delayed = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local cancelled = redis.call('SCARD', KEYS[6])
local ended_with_reason = redis.call('HLEN', KEYS[5])
local failed = ended_with_reason - cancelled
if failed < 0 then failed = 0 end
local held = later - delayed
if held < 0 then held = 0 end
local completed = redis.call('ZCARD', KEYS[4]) - ended_with_reason
if completed < 0 then completed = 0 end
local lag = ''
if oldest ~= nil and claimable > 0 then
  lag = num(tonumber(now) - oldest)
end
-- The longest-held lease: the earliest claim among the held runs, whose index entries are
-- scored after now (with the delayed runs'), read up to the budget across the kinds.
local runs = KEYS[8 + tonumber(ARGV[1])]
local budget = tonumber(ARGV[2])
local first_claim = nil
local now_n = tonumber(now)
for i = 0, tonumber(ARGV[1]) do
  if budget <= 0 then
    break
  end
  local zkey = KEYS[1]
  if i > 0 then
    zkey = KEYS[7 + i]
  end
  local later = redis.call('ZRANGEBYSCORE', zkey, '(' .. now, '+inf', 'LIMIT', 0, budget)
  budget = budget - #later
  for _, m in ipairs(later) do
    local v = redis.call('HGET', runs, string.sub(m, 17))
    -- One match of the record format (common.lua): runnable, owned (a non-empty owner), its
    -- expiry, and its claim time from the times suffix.
    local e, claimed = string.match(v or '', '^runnable:%d+:%d+:(%d+):%x+:[^\1]+\1%d*,(%d+)')
    if e and tonumber(e) > now_n and (first_claim == nil or tonumber(claimed) < first_claim) then
      first_claim = tonumber(claimed)
    end
  end
end
local longest = ''
if first_claim ~= nil then
  longest = num(math.max(tonumber(now) - first_claim, 0))
end
return { tostring(claimable), tostring(held), tostring(delayed),
  tostring(redis.call('ZCARD', KEYS[3])), tostring(completed), tostring(failed),
  tostring(cancelled), lag, longest }
