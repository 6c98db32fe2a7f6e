"""``fedem-private`` whose grid points other than ``seed0`` stop mid-run until a signal comes.

For the tests that stop a sweep: ``BLOCKING_SWEEP_MARKERS=DIR python tests/blocking_sweep.py
sweep ...``; a point that blocks first writes its temporary run directory's path into
``DIR/<pid>`` (its setup files already there), so a test can wait
for that file instead of guessing how long a point takes. The patch is made at import, so
the sweep's worker processes (which import this script as their main module) block too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fedem_private.experiments import runner, sweep

_real_execute = runner.execute


def _blocking_execute(cfg, out, force=False, on_round=None, setup=None, on_start=None,
                      checkpoint=None):
    if Path(out).name == "seed0":
        return _real_execute(cfg, out, force, on_round, setup, on_start, checkpoint)

    def setup_then_wait(sim, path: Path) -> None:
        if setup is not None:
            setup(sim, path)
        markers = Path(os.environ["BLOCKING_SWEEP_MARKERS"])
        (markers / f".{os.getpid()}").write_text(str(path))
        os.replace(markers / f".{os.getpid()}", markers / str(os.getpid()))
        while True:  # until a signal handler raises, or the pool's stop flag is set
            stop = sweep._STOP
            if stop is not None and stop.is_set():
                # as sweep._on_sigint does: a SIGTERM arriving next must not raise a
                # second interrupt inside the run directory's clean-up
                sweep._BUSY = False
                raise KeyboardInterrupt
            time.sleep(0.05)

    return _real_execute(cfg, out, force, on_round, setup_then_wait, on_start)


runner.execute = _blocking_execute

if __name__ == "__main__":
    from fedem_private.cli import main

    sys.exit(main(sys.argv[1:]))
