#!/bin/bash
# CartPole to 475: stop 39's defaults (lookahead 0) and a lookahead of 30 that grows with the anneal, in turn per seed.
mkdir -p /work/runs/s40/cp && cd /work/runs/s40/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.lookahead 0 --logdir g0_$s > g0_$s.log 2>&1
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.lookahead 30 --vtrace.grow-lookahead true --logdir g30_$s > g30_$s.log 2>&1
done
for f in g0_0 g30_0 g0_1 g30_1 g0_2 g30_2; do echo "$f.log: $(grep -h 'done (' $f.log)"; done
