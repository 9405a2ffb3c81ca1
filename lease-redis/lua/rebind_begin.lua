-- KEYS[1]: the restore marker; KEYS[2]: the fence floor
-- ARGV[1]: how far to raise (2^32, decimal)
-- Returns: {floor}: the floor after.
-- The first step of a rebind (src/epoch.rs): claims stay refused while the runs are raised
-- page by page (the marker), and the floor rises first, so that a run created meanwhile
-- starts above every fence the history before the restore issued.
redis.call('SET', KEYS[1], 'a rebind is in progress')
local floor = add(redis.call('GET', KEYS[2]) or '0', ARGV[1])
redis.call('SET', KEYS[2], floor)
return { floor }
