"""The share of a round's CPU time spent planning and drawing random numbers (issue 43).

    python -m benchmarks.probes.draw_share [--data ml-100k|ml-1m-size] [--method fedem] [--rounds 2]
    cd OLD && PYTHONPATH=OLD python NEW/benchmarks/probes/draw_share.py ...   # an older checkout

One warm-up round, then ``--rounds`` timed rounds. Every function that plans a chunk or
draws a round's random numbers is wrapped and its process CPU time summed (time.process_time:
CPU seconds, not wall seconds, so a loaded machine changes them little); the planning
functions are counted once, including the draws they make. The wrapped names are looked up
where they exist, so the same script measures a checkout from before the keyed draws
(the second command: run from the old checkout's root, its package and benchmarks import).
Prints one JSON line: CPU seconds per round, of which planning and draws, and their share.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import fedem_private
from benchmarks.common import emit, run_config  # absolute: the file also runs as a script
from benchmarks.probes.speed import MEMORY_DATA
from fedem_private.experiments.runner import prepare

# (module, function): plans and draws of a round. make_plan includes the chunk's epoch
# orders; adapter_batches (a generator) the adapter's; client_noise the mechanisms' noise.
TIMED = [("fedem_private.models.base", "make_plan"),
         ("fedem_private.models.base", "draw_samples"),
         ("fedem_private.client.merging", "adapter_batches"),
         ("fedem_private.rng", "client_noise")]


class Clock:
    """CPU seconds spent inside the wrapped functions (outermost call only)."""

    def __init__(self) -> None:
        self.seconds, self.depth = 0.0, 0

    def _enter(self) -> float:
        self.depth += 1
        return time.process_time()

    def _leave(self, t0: float) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.seconds += time.process_time() - t0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def gen(it: Iterator[Any]) -> Iterator[Any]:
            while True:
                t0 = clock._enter()
                try:
                    item = next(it)
                except StopIteration:
                    clock._leave(t0)
                    return
                clock._leave(t0)
                yield item

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            t0 = self._enter()
            try:
                out = fn(*args, **kwargs)
            finally:
                self._leave(t0)
            return gen(out) if isinstance(out, Iterator) else out

        return inner


def _patch(clock: Clock) -> list[str]:
    """Wrap every TIMED function in its module and wherever it was imported by name."""
    import sys

    done = []
    for mod_name, name in TIMED:
        mod = sys.modules.get(mod_name) or __import__(mod_name, fromlist=[name])
        fn = getattr(mod, name, None)
        if fn is None:
            continue
        wrapped = clock.wrap(fn)
        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").startswith("fedem_private") and \
                    getattr(m, name, None) is fn:
                setattr(m, name, wrapped)
        done.append(f"{mod_name}.{name}")
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="ml-100k")
    ap.add_argument("--method", default="fedem")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dataset, over = MEMORY_DATA.get(args.data, (args.data, {}))
    cfg = run_config(dataset, **over, **{"federation.method": args.method,
                                         "train.rounds": args.rounds + 1,
                                         "train.eval_every": 10_000, "train.device": "cpu"})
    sim = prepare(cfg)
    sim.step()  # warm-up
    clock = Clock()
    wrapped = _patch(clock)
    t0 = time.process_time()
    for _ in range(args.rounds):
        sim.step()
    total = (time.process_time() - t0) / args.rounds
    draws = clock.seconds / args.rounds
    emit({"code": fedem_private.__file__, "data": args.data, "method": args.method,
          "cpu_s_per_round": round(total, 3), "plan_and_draws_cpu_s": round(draws, 3),
          "share": round(draws / total, 4), "wrapped": wrapped})


if __name__ == "__main__":
    main()
