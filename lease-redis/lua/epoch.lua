-- KEYS[1]: the namespace's epoch (a counter); KEYS[2]: the restore marker
-- ARGV[1]: the highest epoch the calling store has seen acknowledged (0 for none)
-- Returns: {epoch, marker}: the epoch after this call's increment (decimal), and the marker's
-- text, or nil when it is not set.
-- Run by every store at connect, on every new connection and every 30 s (src/epoch.rs). An
-- epoch not above one a store had seen means the namespace went back: it was restored from an
-- older RDB or AOF (or a replica that had not received the increments was promoted). The
-- marker is then set, in the same atomic step, so that every claiming script refuses until an
-- operator rebinds (rebind_end.lua clears it).
local epoch = redis.call('INCR', KEYS[1])
local seen = tonumber(ARGV[1])
if epoch <= seen and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], 'the epoch went back to ' .. epoch .. ' under a store that had seen '
    .. ARGV[1])
end
return { tostring(epoch), redis.call('GET', KEYS[2]) }
