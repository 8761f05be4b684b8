#!/bin/bash
# CartPole to 475 on a quiet machine: stop 38's defaults (lookahead 0) and lookahead 30, in turn per seed.
mkdir -p /work/runs/s40/cp && cd /work/runs/s40/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.lookahead 0 --logdir la0_$s > la0_$s.log 2>&1
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.lookahead 30 --logdir la30_$s > la30_$s.log 2>&1
done
for f in la0_0 la30_0 la0_1 la30_1 la0_2 la30_2; do echo "$f.log: $(grep -h 'done (' $f.log)"; done
