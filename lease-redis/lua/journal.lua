-- KEYS[1]: run hash; KEYS[2]: journal (list)
-- ARGV[1]: none
-- Returns: {'none'} or {'ok', entry, entry, ...}, each entry '<fence>:<written_at>:<payload>'
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 'none' }
end
local out = redis.call('LRANGE', KEYS[2], 0, -1)
table.insert(out, 1, 'ok')
return out
