#!/bin/bash
# CartPole to 475, the defaults (annealed bonus) and the constant bonus in turn per seed.
cd /work/runs/s38/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --vtrace.anneal-entropy-cost false --logdir old$s > old$s.log 2>&1
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --logdir new$s > new$s.log 2>&1
done
for f in old0 new0 old1 new1 old2 new2; do echo "$f.log: $(grep -h 'done (' $f.log)"; done
