-- KEYS[1]: runs hash; KEYS[2]: the run's journal (list)
-- ARGV[1]: encoded run id
-- Returns: {'none'} or {'ok', entry, entry, ...}, each entry '<fence>:<written_at>:<payload>'
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return { 'none' }
end
local out = redis.call('LRANGE', KEYS[2], 0, -1)
table.insert(out, 1, 'ok')
return out
