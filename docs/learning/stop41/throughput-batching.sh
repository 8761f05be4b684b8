#!/bin/bash
# alternated: server.batching auto (default) vs wait; 2x32 no-train, 8x8 no-train, 2x32 train
source /work/main/.venv/bin/activate
cd /work/runs/s41
for r in 1 2 3; do for b in auto wait; do
  for cfg in "2 32 --no-train" "8 8 --no-train" "2 32"; do
    set -- $cfg
    out=auto-r$r-$b-a$1x$2${3:+-nt}.json
    uptime > $out.uptime
    seedq bench throughput --env CartPole-v1 --actors $1 --envs-per-actor $2 --seconds 10 $3 --server.batching $b --json > $out 2>/dev/null
  done
done; done
echo done
