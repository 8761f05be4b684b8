#!/bin/bash
# CartPole to 475 on a quiet machine: unrolls of 10 x 16 (stop 38's defaults) and 40 x 4 in turn per seed.
cd /work/runs/s39/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --logdir u10_$s > u10_$s.log 2>&1
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.unroll-length 40 --vtrace.batch-size 4 --logdir u40_$s > u40_$s.log 2>&1
done
for f in u10_0 u40_0 u10_1 u40_1 u10_2 u40_2; do echo "$f.log: $(grep -h 'done (' $f.log)"; done
