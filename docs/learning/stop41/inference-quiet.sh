#!/bin/bash
# issue 16 acc 1 on a quiet machine: three runs in a row
source /work/main/.venv/bin/activate
cd /work/runs/s41
for r in 1 2 3; do
  uptime > inf-$r.uptime
  seedq bench inference --net mlp,nature_cnn,impala_cnn --precision fp32,int8 --batch 16,64,256 --json > inf-$r.json 2> inf-$r.err
  uptime >> inf-$r.uptime
done
echo done
