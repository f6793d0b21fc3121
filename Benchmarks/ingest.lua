-- wrk script for `crashcap-bench ingest`: each wrk thread (one connection) POSTs its own file
-- of ready-made upload bodies, one per line, each batch with event ids no other carries.
--   wrk -t4 -c4 -d3s --latency -s Benchmarks/ingest.lua URL -- BODIES_PREFIX
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

local bodies = {}
local index = 0
function init(args)
  for line in io.lines(args[1] .. id .. ".txt") do bodies[#bodies + 1] = line end
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"

function request()
  -- Past the last body the batches come again: the benchmark counts what was stored.
  index = index % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[index])
end
