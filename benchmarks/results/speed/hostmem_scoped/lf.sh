cd /work/main
export OMP_NUM_THREADS=2
python -m benchmarks.profile_round --data lastfm-2k --method fedem > /tmp/lf/scoped.log 2>&1
FEDEM_PRIVATE_MALLOC=system python -m benchmarks.profile_round --data lastfm-2k --method fedem > /tmp/lf/system.log 2>&1
python -c "
import sys, runpy
from fedem_private import hostmem
cm = hostmem.keep_freed_memory(); cm.__enter__()   # the old process-wide tuning
sys.argv = ['profile_round', '--data', 'lastfm-2k', '--method', 'fedem']
runpy.run_module('benchmarks.profile_round', run_name='__main__')
" > /tmp/lf/always.log 2>&1
