"""Run plain functions as Ray tasks: the back end of ``fedem-private sweep --ray``.

Ray is optional (``pip install 'fedem-private[ray]'``) and imported only when
a function here is called. :func:`ray_session` starts a local Ray instance or
connects to a running cluster (``auto``, ``HOST:6379``, ``ray://HOST:10001``)
and shuts down only what it started; :func:`run_tasks` runs one function over
a list of argument tuples, a bounded number at a time, and reports each result
as it finishes. Nothing here knows about sweeps.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from fedem_private.errors import UserError

LOCAL = "local"  # the address that starts a new local instance (as ``ray.init`` reads it)
RAY_MISSING = "--ray needs Ray, which is not installed: pip install 'fedem-private[ray]'"
CONNECT_TIMEOUT_S = 5.0
CANCEL_GRACE_S = 30.0  # how long interrupted tasks get to remove their temporary files
CANCEL_ATTEMPTS = 3  # the grace is split between this many cancel requests


def ray_installed() -> bool:
    """True when ``import ray`` would find a package (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def import_ray() -> ModuleType:
    """The ``ray`` module, or a :class:`UserError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(RAY_MISSING) from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; None for other forms."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast when a ``HOST:PORT`` address does not answer (``ray.init`` retries for minutes).

    ``auto`` and other forms are left to Ray, which answers those at once.
    """
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise UserError(f"cannot reach Ray at {address}: {why} (is `ray start --head` "
                        "running there, and is the port open?)") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def ray_session(address: str = LOCAL, num_cpus: int | None = None,
                ship: Sequence[str] = ()) -> Iterator[str]:
    """Start a local Ray instance (``address`` ``local``) or connect to a cluster.

    ``num_cpus`` sizes a local instance (None: every core); a cluster has its
    own. ``ship``: package directories uploaded to a cluster's workers (Ray's
    ``py_modules``), so that they run the driver's code, whatever version the
    nodes have installed; a local instance imports the driver's code anyway.
    Yields a short description (``local Ray, 2 CPUs``). A Ray already
    initialised in this process (e.g. by a notebook) is used as it is and left
    running; one started or connected here is shut down on exit. A bad address
    or missing Ray raises :class:`UserError`.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield f"Ray already running here, {_cpus(ray)}"
        return
    if address != LOCAL:
        check_reachable(address)
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
    if address == LOCAL:
        kwargs.update(num_cpus=num_cpus, include_dashboard=False)
    elif ship:
        kwargs.update(runtime_env={"py_modules": list(ship)})
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        ray.shutdown()
        where = "start a local Ray instance" if address == LOCAL else f"connect to Ray at {address}"
        raise UserError(f"cannot {where}: {_first_line(exc)}") from None
    try:
        yield f"{'local Ray' if address == LOCAL else f'Ray at {address}'}, {_cpus(ray)}"
    finally:
        ray.shutdown()


def _cpus(ray: ModuleType) -> str:
    try:
        n = int(ray.cluster_resources().get("CPU", 0))
    except Exception:  # pragma: no cover - a cluster that does not answer
        return "CPUs unknown"
    return f"{n} CPU" + ("" if n == 1 else "s")


def run_tasks(fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], limit: int,
              on_result: Callable[[int, Any, BaseException | None], None]) -> None:
    """Run ``fn(*args)`` for each tuple in ``calls`` as Ray tasks (1 CPU each, no retries).

    Each task gets a fresh worker process (Ray's ``max_calls=1``): a cancelled
    task's KeyboardInterrupt can land inside an ``import`` and leave a module
    half-initialised in that process (CI saw the next task in the same worker
    fail with "module 'sympy' has no attribute 'printing'"), so a worker is
    never reused. It costs a process start and the imports per task, small
    beside a sweep point or a tuning trial.

    At most ``limit`` tasks are in flight (<= 0: all of them; Ray still runs
    only as many as it has CPUs). ``on_result(i, value, error)`` is called in
    the driver, in finishing order, with ``calls[i]``'s return value, or with
    the Ray error (a dead worker, a lost node) and ``value`` None. Needs a
    running :func:`ray_session`. On an exception in the driver (Ctrl-C, or
    ``on_result`` raising), the tasks in flight are cancelled: each gets a
    KeyboardInterrupt and up to :data:`CANCEL_GRACE_S` seconds to clean up,
    while tasks not yet submitted never start; then the exception propagates.
    """
    ray = import_ray()
    remote = ray.remote(num_cpus=1, max_retries=0, max_calls=1)(fn)
    limit = len(calls) if limit <= 0 else limit
    queue = list(enumerate(calls))
    queue.reverse()  # pop() from the end submits in order
    in_flight: dict[Any, int] = {}
    try:
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                i, args = queue.pop()
                in_flight[remote.remote(*args)] = i
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                i = in_flight.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    on_result(i, None, exc)
                else:
                    on_result(i, value, None)
    except BaseException:
        _cancel(ray, list(in_flight))
        raise


def is_cancelled(error: BaseException) -> bool:
    """True when a Ray error reported by :func:`run_tasks` says the task was cancelled."""
    return isinstance(error, import_ray().exceptions.TaskCancelledError)


def _cancel(ray: ModuleType, refs: list[Any]) -> None:
    """Interrupt ``refs`` and give them a moment to unwind (their results are dropped).

    The KeyboardInterrupt reaches a task at its next Python instruction: a
    training loop stops within a step, one long C call only once it returns.
    A task it has not reached after the grace (under heavy load Ray can drop
    every polite cancel of a task that has just started: seen in CI) is killed
    with its worker process (``force``); the temporary run folder such a task
    leaves carries a dead writer's pid and is removed by the next run of the
    sweep, as a SIGKILLed sweep's is (:func:`~fedem_private.experiments.rundir.
    remove_stale`).
    """
    pending = list(refs)
    for _ in range(CANCEL_ATTEMPTS):
        # asked again each time: a cancel that reaches a task Ray has not yet seen start
        # can be lost (seen under heavy load), one sent after it started is delivered
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        with contextlib.suppress(Exception):
            _, pending = ray.wait(pending, num_returns=len(pending),
                                  timeout=CANCEL_GRACE_S / CANCEL_ATTEMPTS)
        if not pending:
            return
    for ref in pending:  # still running: end it with its worker
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    with contextlib.suppress(Exception):
        ray.wait(pending, num_returns=len(pending), timeout=CANCEL_GRACE_S)
