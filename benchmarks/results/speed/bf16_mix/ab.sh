#!/bin/bash
cd /work/main
for side in new old new old; do
  if [ $side = old ]; then pre="import fedem_private.server.aggregation as a; a.cpu_bf16_matmul = lambda: False;"; else pre=""; fi
  OMP_NUM_THREADS=1 /usr/bin/time -f "$side maxrss_kb=%M wall=%e" /work/venv/bin/python -c "
$pre
import runpy, sys
sys.argv = ['profile_round', '--data', 'lastfm-2k', '--method', 'fedem', '--timed', '1', '--set', 'train.state_dtype=\"bfloat16\"']
runpy.run_module('benchmarks.probes.profile_round', run_name='__main__')
" > /tmp/mix/$side.$RANDOM.log 2>&1
done
