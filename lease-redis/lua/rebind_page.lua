-- KEYS[1]: runs hash
-- ARGV[1]: the HSCAN cursor to continue from ('0' to start); ARGV[2]: how far to raise each
-- fence (2^32, decimal)
-- Returns: {cursor, raised}: the cursor to call again with ('0' once every record was seen),
-- and how many records this call raised.
-- One page of a rebind: every record's fence rises by ARGV[2] (to FENCE_MAX at most). A
-- record HSCAN returns twice is raised twice, which only raises it further.
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', 500)
local fields = page[2]
local raised = 0
for i = 1, #fields, 2 do
  local r = read_run(KEYS[1], fields[i])
  if r then
    r.f = add(r.f, ARGV[2])
    write_run(KEYS[1], r)
    raised = raised + 1
  end
end
return { page[1], tostring(raised) }
