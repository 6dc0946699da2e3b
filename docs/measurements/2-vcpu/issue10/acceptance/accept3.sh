#!/bin/bash
while pgrep -f "bash accept2.sh" >/dev/null; do sleep 10; done
B=/tmp/uffd-pager-final
out=/tmp/runs/soak-file.txt
start=$(date +%s)
timeout 2400 $B torture --duration 30m --threads 4 --churn --pages 16384 --budget 4096 --dir /tmp --seed 300 > $out 2>&1
echo "soak file rc=$? $(( $(date +%s)-start ))s $(grep -E 'mismatches|peak|churn' $out | tr -s ' ' | tr '\n' ' ') $(grep -E 'PASS|FAIL' $out)" >> /tmp/runs/summary.txt
echo done3 >> /tmp/runs/summary.txt
