#!/bin/bash
# alternated: batch timeout 0 vs 0.5 ms; 2x32 no-train, 8x8 no-train, 2x32 train
source /work/main/.venv/bin/activate
cd /work/runs/s41
for r in 1 2 3; do for t in 0 0.5; do
  for cfg in "2 32 --no-train" "8 8 --no-train" "2 32"; do
    set -- $cfg
    out=tp-r$r-t$t-a$1x$2${3:+-nt}.json
    uptime > $out.uptime
    seedq bench throughput --env CartPole-v1 --actors $1 --envs-per-actor $2 --seconds 10 $3 --server.batch-timeout-ms $t --json > $out 2>/dev/null
  done
done; done
echo done
