#!/usr/bin/env bash
# Seed 000's reproducer (preload/tests/c/mmap_thrash.c, the same program
# the seed describes), unmodified, under the LD_PRELOAD shim, once per
# policy; prints the seed's table from the pager's counters.
#   scripts/seed-preload.sh SHIM.so THREADS SECONDS BUDGET LATENCY
set -euo pipefail
shim=$1 threads=$2 secs=$3 budget=$4 latency=$5
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/seed-preload.XXXXXX")
trap 'rm -rf "$dir"' EXIT
cc -O2 -pthread "$(dirname "$0")/../preload/tests/c/mmap_thrash.c" -o "$dir/mmap_thrash"
echo "# $threads threads, 16 MiB file each, ${secs} s, budget $budget, store latency $latency"
printf '| %-10s | %12s | %10s | %12s | %15s | %13s |\n' Policy "Total Rounds" Throughput "Miss/Drop(%)" RETRY_MMAP_DROP RETRY_IO_MISS
printf '|%s|%s|%s|%s|%s|%s|\n' ------------ -------------- ------------ -------------- ----------------- ---------------
for policy in vanilla retry-once; do
  out=$(LD_PRELOAD=$shim UFFD_PAGER_FILES="$dir/test_file_*" UFFD_PAGER_BUDGET=$budget \
        UFFD_PAGER_POLICY=$policy UFFD_PAGER_LATENCY=$latency UFFD_PAGER_STATS="$dir/stats" \
        "$dir/mmap_thrash" "$dir" "$threads" "$secs")
  grep -q 'data ok' <<<"$out" || { echo "$out"; exit 1; }
  rounds=$(sed -n 's/^Total rounds : //p' <<<"$out")
  tput=$(sed -n 's/^Throughput : \([0-9.]*\).*/\1/p' <<<"$out")
  drop=$(awk '$1=="retry_mmap_drop"{print $2}' "$dir/stats")
  miss=$(awk '$1=="retry_io_miss"{print $2}' "$dir/stats")
  pct=$(awk -v m="$miss" -v d="$drop" 'BEGIN{printf "%.2f", d ? 100*m/d : 0}')
  printf '| %-10s | %12s | %8s/s | %12s | %15s | %13s |\n' "$policy" "$rounds" "$tput" "$pct" "$drop" "$miss"
done
