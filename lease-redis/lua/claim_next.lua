-- KEYS[1]: runs hash; KEYS[2]: the kind's claimable index at priority 0 (zset, score =
-- instant claimable in microseconds, member = 16 hex digits of creation order followed by the
-- encoded run id); KEYS[3]: attempts hash; KEYS[4]: history hash (a claim that takes over an
-- expired lease writes that attempt, ended at its expiry); KEYS[4+p]: the kind's claimable
-- index at priority p, for p from 1 to MAX_PRIORITY; KEYS[14]: payloads hash; KEYS[15]: the restore
-- marker (src/epoch.rs); KEYS[16]: the queues hash (src/keys.rs); KEYS[17]: the wait hash;
-- KEYS[18]: the deadlines zset; KEYS[19]: the resumed hash; KEYS[20]: suspended runs (zset)
-- (record.lua describes the three for waits)
-- ARGV[1]: worker id; ARGV[2]: TTL in milliseconds; ARGV[3]: most runs to claim; ARGV[4]:
-- most index entries to examine that turn out not to be claimable; ARGV[5]: the queue the
-- indexes belong to (nothing is claimed while it is paused)
-- Returns: {'restored', marker} (nothing written: the namespace was restored and is not
-- rebound yet), or flat {more, encoded id, fence, expiry, attempts, payload, priority, waited
-- (µs the run had been claimable: now less its index score), resumed (as claim.lua returns
-- it), trace parent (common.lua's trace_of: its text, or nil for none), encoded id, ...}, the
-- highest priority first, then the longest claimable first (each claim counts against its run's
-- attempt budget), where more is '1' if the examination budget ran out before `max` runs
-- were claimed or the due entries ran out (call again), else '0'. The payload is common.lua's
-- payload_of: its bytes, or nil for none. It is read here, in the claim's own atomic step, so
-- that it is the payload of the life this call claimed: a read after the script could meet
-- the run cancelled, purged and created again since, and hand the dead lease the new life's
-- payload. (Copied through the script, a 1 KiB payload costs the server about 2.3 µs per run
-- claimed, against about 1 µs read apart, on a claim of about 13 µs: BENCHMARKS.md,
-- lease-redis/tests/server_cpu.rs.)
-- Claims, renewals and ends keep the index exact, so a due entry is normally claimable: a
-- runnable run, or one suspended waiting for a signal whose deadline (its score) has passed,
-- which the claim ends timed out, as claim.lua does. An entry that is not (its run gone or
-- ended, suspended without a wait due, or held: an index written by an older version of this
-- adapter, whose renewals left it behind) is removed or moved to the lease's expiry or the
-- wait's deadline; at most ARGV[4] of them per call, so one call's work is bounded however
-- many there are.
local restored = redis.call('GET', KEYS[15])
if restored then
  return { 'restored', restored }
end
-- A paused queue: nothing claimed, nothing examined (one field read per call).
local paused = redis.call('HGET', KEYS[16], ARGV[5])
if paused and string.sub(paused, 1, 1) == '1' then
  return { '0' }
end
local now = now_micros()
local expires = now + tonumber(ARGV[2]) * 1000
local max = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local initial_budget = budget
local out = { '0' }
local taken = 0
-- The priorities from the highest down; each index's claimable range in order.
for priority = MAX_PRIORITY, 0, -1 do
  local zkey = KEYS[2]
  if priority > 0 then
    zkey = KEYS[4 + priority]
  end
  while taken < max do
    -- As many entries as runs still wanted; once stale entries have turned up, as many as the
    -- budget has left (more stale ones are likely, and one range read each would cost more
    -- than the entries themselves), stopping once enough runs are taken.
    local want = max - taken
    if budget < initial_budget then
      want = math.max(want, budget)
    end
    local members = redis.call('ZRANGEBYSCORE', zkey, '-inf', num(now), 'WITHSCORES', 'LIMIT', 0,
      want)
    if #members == 0 then
      break
    end
    for j = 1, #members, 2 do
      local m = members[j]
      if taken >= max then
        break
      end
      if budget <= 0 then
        out[1] = '1'
        return out
      end
      local r = read_run(KEYS[1], string.sub(m, 17))
      local wf, wd, wn
      if r and r.m == m and r.s == 'suspended' and r.f ~= FENCE_MAX then
        wf, wd, wn = wait_due(KEYS[17], r.id, now)
      end
      if r and r.m == m and (wf or claimable(r, now)) then
        if r.o ~= '' then
          end_attempt(KEYS[4], KEYS[3], r, tonumber(r.e), 'expired', nil)
        end
        local resumed = false
        if wf then
          resumed = time_out(KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[3], r.id, wf, wd, wn)
          r.s = 'runnable'
        elseif waited(r.t) then
          resumed = redis.call('HGET', KEYS[19], r.id)
        end
        local fence = take(KEYS[1], zkey, r, ARGV[1], expires, now)
        out[#out + 1] = r.id
        out[#out + 1] = fence
        out[#out + 1] = num(expires)
        out[#out + 1] = tostring(redis.call('HINCRBY', KEYS[3], r.id, 1))
        out[#out + 1] = payload_of(KEYS[14], r.id, r.t)
        out[#out + 1] = tostring(priority)
        out[#out + 1] = num(math.max(now - tonumber(members[j + 1]), 0))
        out[#out + 1] = resumed
        out[#out + 1] = trace_of(KEYS[14], r.id, r.t)
        taken = taken + 1
      else
        budget = budget - 1
        local later = r and r.m == m and r.s == 'suspended' and r.f ~= FENCE_MAX
          and string.match(redis.call('HGET', KEYS[17], r.id) or '', '^%d+:(%d+):')
        if r and r.m == m and r.s == 'runnable' and r.f ~= FENCE_MAX and r.e ~= '' then
          -- Held and not expired (the index lagged behind a renewal), or delayed: move it to
          -- the expiry or the delay's end.
          redis.call('ZADD', zkey, r.e, m)
        elseif later then
          -- Waiting for a signal until a later deadline: claimable from then.
          redis.call('ZADD', zkey, later, m)
        else
          -- Gone, ended or exhausted: never claimable from the index.
          redis.call('ZREM', zkey, m)
        end
      end
    end
  end
end
return out
