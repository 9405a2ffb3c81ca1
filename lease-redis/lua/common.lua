-- Shared helpers, prepended to every script of this crate except the hot ones (claim.lua,
-- renew.lua, fenced.lua), which read and write the record with record.lua's helpers as these
-- do; not a script by itself.
-- KEYS[1]: none (each script declares its own keys below this prelude)
-- ARGV[1]: none
-- Returns: nothing; defines local helpers.
--
-- A namespace keeps every run record in one hash (the runs hash), so that a script declares
-- every key it touches, as a Cluster proxy that checks declared keys requires. The field is
-- the run id in hex; the value is 'state:fence:heartbeats:expiry:member:owner' where state is
-- runnable, suspended, completed, failed or cancelled; fence and heartbeats are decimal strings (never Lua
-- numbers, so values above 2^53 stay exact); expiry is microseconds on the server clock: the
-- lease's expiry when owned; for an unowned runnable run the instant it is claimable from:
-- the end of its delay or retry delay, else when it became claimable (its creation, release,
-- resume or force-release; empty in a record a release wrote before this was kept); else
-- empty; member is the run's member in the claimable index; owner is the
-- holder's worker id, or empty, and may contain ':'. Then, in records written since times
-- were kept, a byte 1 (no worker id holds a control character, so a record without times
-- reads the same) and the run's times in microseconds on the server clock: 'created,claimed,
-- renewed' (when it was created, when its latest claim took it, when that lease was last
-- renewed; each empty when unknown or none). Then, in records created since they were kept, the
-- facts fixed at the run's creation that spare a script a look-up: a byte 2 and the run's
-- flags, letters: 'd' (of the default class: no field in the kinds hash), 'n' (no payload:
-- no field in the payloads hash), 't' (it has a trace parent: a field 't:<id>' in the payloads
-- hash, the traceparent's 55 bytes; a run without it, as every run created before trace
-- parents were kept, has none, and none is looked up) and 'w' (it has waited for a signal: the one flag set after
-- its creation, by its first wait, which gives a record older than its facts the facts 'w'
-- alone; a run without it has no field in the resumed hash, which record.lua describes);
-- then, for a run of another class, a byte 3 and its class (as
-- the kinds hash keeps it; a kind holds no control character, so the class runs to the
-- record's end). A record without them (one created before they were kept) says nothing, and
-- its scripts look the facts up. A run's end time is its score in the ended
-- runs zset (retention's). A failed or
-- cancelled run's reason is in the failures hash, field id; a cancelled run's id is also in
-- the cancelled set (count tells the two apart with it). A run's class is its kind and
-- priority: '' for the default kind at priority 0, else the kind's name ('' for the default)
-- followed, for a priority above 0, by a newline and the priority. A run of another class than
-- '' has it in the kinds hash (field id), and its index entry in that class's claimable index;
-- a script that writes a run's index entry is told the index the client presumes, with the
-- class it presumes, and answers {'kind', actual class} without writing when the run is of
-- another class, so that the client sends the call again with the right index.
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

-- The larger of two fences written as decimal strings without leading zeros.
local function fence_max(a, b)
  if #a > #b or (#a == #b and a > b) then return a end
  return b
end

local function read_run(runs, id)
  local v = redis.call('HGET', runs, id)
  if not v then
    return nil
  end
  local s, f, h, e, m, o, t = string.match(v, RECORD)
  if not s then
    error('malformed run record for ' .. id)
  end
  return { id = id, s = s, f = f, h = h, e = e, m = m, o = o, t = t }
end

-- The encoded id of the live run (runnable or suspended) holding unique key k, or nil: uniq
-- names the run that took k last, which holds it only while it is live.
local function unique_holder(runs, uniq, k)
  local id = redis.call('HGET', uniq, k)
  if not id then
    return nil
  end
  local r = read_run(runs, id)
  if r and (r.s == 'runnable' or r.s == 'suspended') then
    return id
  end
  return nil
end

local function write_run(runs, r)
  redis.call('HSET', runs, r.id, r.s .. ':' .. r.f .. ':' .. r.h .. ':' .. r.e .. ':' .. r.m .. ':' .. r.o .. r.t)
end

-- A record's times suffix (r.t) as its three times: created, claimed, renewed ('' each when
-- unknown or none; all '' for a record written before times were kept), and its facts (the
-- rest: '' for a record written before they were kept).
local function times_of(t)
  local c, cl, rn, facts = string.match(t, '^\1(%d*),(%d*),(%d*)(.*)$')
  return c or '', cl or '', rn or '', facts or ''
end

-- The times suffix of a record, its facts (times_of's fourth value) after them.
local function times_suffix(created, claimed, renewed, facts)
  return '\1' .. created .. ',' .. claimed .. ',' .. renewed .. (facts or '')
end

-- The facts of a run created of class `class` ('' for the default) with the payload `marked`
-- ('' for none, else '=' and its bytes) and the trace parent `trace` ('' for none).
local function creation_facts(class, marked, trace)
  local flags = '\2' .. (class == '' and 'd' or '') .. (marked == '' and 'n' or '')
    .. (trace ~= '' and 't' or '')
  if class ~= '' then
    return flags .. '\3' .. class
  end
  return flags
end

-- Whether the times suffix `t` of a record carries the flag `letter`.
local function flagged(t, letter)
  local flags = string.match(t or '', '\2(%l*)')
  return flags ~= nil and string.find(flags, letter, 1, true) ~= nil
end

-- Whether the run of the times suffix `t` may have a field in the resumed hash: flagged 'w'.
local function waited(t)
  return flagged(t, 'w')
end

-- The times suffix `t` flagged 'w'. A record older than its facts gets facts of the flag
-- alone, which say no more of its class and payload than their absence did: both are looked
-- up, as before.
local function with_waited(t)
  if waited(t) then
    return t
  elseif string.find(t, '\2', 1, true) then
    return (string.gsub(t, '\2', '\2w', 1))
  end
  local created, claimed, renewed = times_of(t)
  return times_suffix(created, claimed, renewed, '\2w')
end

-- Runnable, unowned or expired, past any retry delay, and not at the last fence.
local function claimable(r, now)
  return r.s == 'runnable' and (r.e == '' or tonumber(r.e) <= now) and r.f ~= FENCE_MAX
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
local function index(zkey, r, at)
  if r.f == FENCE_MAX then
    redis.call('ZREM', zkey, r.m)
  else
    redis.call('ZADD', zkey, num(at), r.m)
  end
end

-- Wake-ups (lease_core::LeaseStore::wakes): tells the namespace's subscribers that a run of
-- the class whose claimable index is `zkey` is claimable from `at` (µs on this server's
-- clock; `now` is the script's time). The channel is the namespace's hash tag followed by
-- ':wake'; the message is the index key's part after ':claimable' (the class: '' for the
-- default kind, ':' and the kind in hex, ':p' and a priority) and the milliseconds until `at`,
-- separated by a space. Sent once per message per script call (a batch of one class, one
-- message). A hint: a subscriber that misses it polls.
local woken = {}
local function wake(zkey, at, now)
  local tag, class = string.match(zkey, '^(.-}):claimable(.*)$')
  if not tag then
    return
  end
  local ms = at > now and math.ceil((at - now) / 1000) or 0
  local msg = class .. ' ' .. string.format('%d', ms)
  if not woken[msg] then
    woken[msg] = true
    redis.pcall('PUBLISH', tag .. ':wake', msg) -- a user without the channel (ACL) wakes no one
  end
end

-- Claims the run at `now`: fence + 1, owner and expiry set, claimed at `now` and not renewed
-- since, index moved to the expiry.
local function take(runs, zkey, r, worker, expires, now)
  r.f = decimal_succ(r.f)
  r.o = worker
  r.e = num(expires)
  local created, _, _, facts = times_of(r.t)
  r.t = times_suffix(created, num(now), '', facts)
  write_run(runs, r)
  index(zkey, r, expires)
  return r.f
end

-- The run's class as the kinds hash `kinds` keeps it: '' for the default kind at priority 0
-- (no field). Not looked up when its record's times suffix `t` says it.
local function kind_of(kinds, id, t)
  if t then
    local class = string.match(t, '\3(.*)$')
    if class then
      return class
    end
    if flagged(t, 'd') then
      return ''
    end
  end
  return redis.call('HGET', kinds, id) or ''
end

-- The record as returned to Rust: state, owner, expiry (or retry delay's end), fence,
-- heartbeats, failure reason ('' unless failed or cancelled; `failures` is the failures hash), attempts
-- (`attempts` is the attempts hash; absent is 0), class ('' for the default kind at priority
-- 0; `kinds` is the kinds hash), times ('created,claimed,renewed,ended' in µs, each '' when
-- unknown or none; the end is the run's score in `ended`, the ended runs zset, for a
-- completed, failed or cancelled run), wait (a suspended run's field in `waits`, the wait
-- hash, as record.lua describes it; '' for none, and always '' when `waits` is nil: a caller
-- whose run cannot be waiting, as it just left any wait).
local function record(r, failures, attempts, kinds, ended, waits)
  local reason = ''
  local ended_at = ''
  if r.s == 'failed' or r.s == 'cancelled' then
    reason = redis.call('HGET', failures, r.id) or ''
  end
  if r.s == 'completed' or r.s == 'failed' or r.s == 'cancelled' then
    local score = redis.call('ZSCORE', ended, r.id)
    if score then
      ended_at = num(tonumber(score))
    end
  end
  local wait = ''
  if waits and r.s == 'suspended' then
    wait = redis.call('HGET', waits, r.id) or ''
  end
  local created, claimed, renewed = times_of(r.t)
  return { r.s, r.o, r.e, r.f, r.h, reason, redis.call('HGET', attempts, r.id) or '0',
    kind_of(kinds, r.id, r.t), created .. ',' .. claimed .. ',' .. renewed .. ',' .. ended_at,
    wait }
end

-- A reply of `status`, then the record's fields, then `now`.
local function record_reply(status, rec, now)
  local out = { status }
  for _, field in ipairs(rec) do
    out[#out + 1] = field
  end
  out[#out + 1] = num(now)
  return out
end

-- What the record's times suffix `t` says of its run's payload: 1 if it has one, false if
-- none, 2 if the record is older than its facts (it may have one).
local function payload_mark(t)
  if not string.find(t or '', '\2', 1, true) then
    return 2
  end
  if flagged(t, 'n') then
    return false
  end
  return 1
end

-- A run's payload as a reply element: its bytes, or false (a nil reply) for none, so an empty
-- payload stays apart from none and the bytes are not copied once more (not looked up when its
-- record's times suffix `t` says it has none).
local function payload_of(payloads, id, t)
  if not payload_mark(t) then
    return false
  end
  return redis.call('HGET', payloads, id)
end

-- A run's trace parent as a reply element: its text, or false (a nil reply) for none; looked
-- up only when its record's times suffix `t` has the flag 't' (a record written before trace
-- parents were kept has none).
local function trace_of(payloads, id, t)
  if not flagged(t, 't') then
    return false
  end
  return redis.call('HGET', payloads, 't:' .. id)
end

-- When a run created at `now` (µs) becomes claimable: after `delay_ms`, and not before
-- `run_at` (µs since the Unix epoch as a decimal string, '' for none).
local function not_before(now, delay_ms, run_at)
  local at = now + delay_ms * 1000
  if run_at and run_at ~= '' and tonumber(run_at) > at then
    at = tonumber(run_at)
  end
  return at
end

-- Stores a created run's payload, given as the create's argument: '' for none, else '='
-- followed by its bytes.
local function store_payload(payloads, id, marked)
  if #marked > 0 then
    redis.call('HSET', payloads, id, string.sub(marked, 2))
  end
end

-- Stores a created run's trace parent (its text; '' for none) in the payloads hash, field
-- 't:' and the id (an id is hex: no payload's field starts with 't').
local function store_trace(payloads, id, trace)
  if trace ~= '' then
    redis.call('HSET', payloads, 't:' .. id, trace)
  end
end

-- Gives a voluntary end's attempt back to the run's budget (never below 0). A counter back at
-- 0 keeps its field ('0'): the run waits for its next claim, which counts 1 again, and purge
-- removes it; deleting it would cost every first attempt's release one more command.
local function refund(attempts, id)
  if redis.call('HINCRBY', attempts, id, -1) < 0 then
    redis.call('HSET', attempts, id, '0')
  end
end

-- The attempt history (lease_core::RunRecord::history): in the history hash, field id, a run's
-- ended attempts, oldest first, the last MAX_HISTORY, separated by byte 30;
-- each 'number<31>fence<31>worker<31>claimed<31>ended<31>outcome<31>error' with times in µs
-- on the server clock (claimed '' when unknown), outcome lease_core::AttemptOutcome's name,
-- and error '' for none, else '=' and the text, cut to at most MAX_ATTEMPT_ERROR_BYTES bytes
-- (lease_core::MAX_ATTEMPT_ERROR_BYTES) at a UTF-8 character boundary. No worker id or reason
-- holds a control character, so neither separator occurs inside a field. An attempt a
-- fenced end wrote has an eighth field, the id of the call that ended it (`call`), by which a
-- resend of that call knows it was applied; readers ignore it. The history's cap and its
-- eighth field's reader are record.lua's (history_with, ended_by), which claim.lua and
-- fenced.lua use too.
local function push_attempt(hist, id, number, fence, worker, claimed, ended, outcome, err, call)
  local e = ''
  if err then
    local cut = #err
    if cut > MAX_ATTEMPT_ERROR_BYTES then
      cut = MAX_ATTEMPT_ERROR_BYTES
      -- Back off while the next byte continues a character (10xxxxxx).
      while cut > 0 and string.byte(err, cut + 1) >= 128 and string.byte(err, cut + 1) < 192 do
        cut = cut - 1
      end
    end
    e = '=' .. string.sub(err, 1, cut)
  end
  local entry = number .. '\31' .. fence .. '\31' .. worker .. '\31' .. claimed .. '\31'
    .. ended .. '\31' .. outcome .. '\31' .. e
  if call then
    entry = entry .. '\31' .. call
  end
  redis.call('HSET', hist, id, history_with(redis.call('HGET', hist, id), entry))
end

-- Writes the held lease's attempt of run r (owner, fence and times not yet cleared) into the
-- history, ended at `ended` as `outcome` by the call `call` (nil when not a fenced end); its
-- number is the budget's counter before any refund.
local function end_attempt(hist, attempts, r, ended, outcome, err, call)
  local _, claimed = times_of(r.t)
  push_attempt(hist, r.id, redis.call('HGET', attempts, r.id) or '0', r.f, r.o, claimed,
    num(ended), outcome, err, call)
end
