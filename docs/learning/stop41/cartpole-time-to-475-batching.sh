#!/bin/bash
# CartPole to 475 with the defaults: server.batching auto (the new default) and wait (the old rule), in turn per seed.
mkdir -p /work/runs/s41/cp && cd /work/runs/s41/cp
for s in 0 1 2; do
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --logdir auto_$s > auto_$s.log 2>&1
  /work/main/.venv/bin/seedq train --env CartPole-v1 --seed $s --server.batching wait --logdir wait_$s > wait_$s.log 2>&1
done
for f in auto_0 wait_0 auto_1 wait_1 auto_2 wait_2; do
  echo "$f.log: $(grep -h 'done (' $f.log) | $(python3 -c "import json; d=json.load(open('$f/summary.json')); print(d['batching'])")"
done
