-- The rebind scripts' helper, prepended to rebind_begin.lua and rebind_page.lua after
-- common.lua; not a script by itself.
-- KEYS[1]: none (each script declares its own keys below this prelude)
-- ARGV[1]: none
-- Returns: nothing; defines add.

-- The sum of two decimal strings without leading zeros, exactly at any length, at most
-- FENCE_MAX (a run at FENCE_MAX is never claimed again, as one at i64::MAX never is).
local function add(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48 end
    if j > 0 then d = d + string.byte(b, j) - 48 end
    out[#out + 1] = string.char(48 + d % 10)
    carry = math.floor(d / 10)
    i, j = i - 1, j - 1
  end
  local sum = string.reverse(table.concat(out))
  return fence_max(sum, FENCE_MAX) == sum and FENCE_MAX or sum
end
