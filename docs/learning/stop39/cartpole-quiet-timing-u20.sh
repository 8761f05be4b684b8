#!/bin/bash
# CartPole to 475 on a quiet machine with unrolls of 20 x 8 (stop 39's third probe).
cd /work/runs/s39/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.unroll-length 20 --vtrace.batch-size 8 --logdir u20_$s > u20_$s.log 2>&1
done
for f in u20_0 u20_1 u20_2; do echo "$f.log: $(grep -h 'done (' $f.log)"; done
# The defaults again right after, seed by seed (u10b_S), for the same sitting:
#   /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --logdir u10b_$s
