#!/bin/bash
# Acceptance runs on the final build: 10 anonymous + 10 file-backed 10^7-op
# tortures with distinct seeds, then two 30-minute soaks.
B=/tmp/uffd-pager-final
for seed in 201 202 203 204 205 206 207 208 209 210; do
  for kind in anonymous file; do
    out=/tmp/runs/torture-$kind-$seed.txt; grep -q "torture $kind seed $seed rc=" /tmp/runs/summary.txt && continue
    if [ $kind = file ]; then extra="--dir /tmp"; else extra="--kind anonymous"; fi
    start=$(date +%s)
    $B torture --ops 10000000 --threads 2 --pages 16384 --budget 4096 $extra --seed $seed > $out 2>&1
    echo "torture $kind seed $seed rc=$? $(( $(date +%s)-start ))s $(grep -E 'mismatches' $out | tr -s ' ') $(grep -E 'PASS|FAIL' $out)" >> /tmp/runs/summary.txt
  done
done
for kind in anonymous; do
  out=/tmp/runs/soak-$kind.txt
  if [ $kind = file ]; then extra="--dir /tmp"; else extra="--kind anonymous"; fi
  start=$(date +%s)
  timeout 2400 $B torture --duration 30m --threads 4 --churn --pages 16384 --budget 4096 $extra --seed 300 > $out 2>&1
  echo "soak $kind rc=$? $(( $(date +%s)-start ))s $(grep -E 'mismatches|peak|churn' $out | tr -s ' ' | tr '\n' ' ') $(grep -E 'PASS|FAIL' $out)" >> /tmp/runs/summary.txt
done
echo done >> /tmp/runs/summary.txt
