"""Where the heavy tensors live: ``--device cpu|cuda|auto`` (``train.device``; docs/design.md §13).

The device is a plain value threaded through constructors (never global
state). Every random draw is still made on the CPU, by the counter-based
generators of :mod:`fedem_private.rng`, and the result is moved to the
device, so a GPU run uses exactly the random numbers of a CPU run and the two
agree within float tolerance (reductions are summed in another order).

Importing this module is light: torch is imported only when a name other
than ``cpu`` is resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedem_private.errors import UserError

if TYPE_CHECKING:
    import torch

#: the names ``--device`` accepts; ``auto`` is cuda when a GPU is available, else cpu
DEVICES = ("cpu", "cuda", "auto")


def check_name(name: str, where: str = "--device (train.device)") -> None:
    """Raise a one-line UserError unless ``name`` is one of :data:`DEVICES`."""
    if name not in DEVICES:
        raise UserError(f"{where} must be one of {', '.join(DEVICES)}, got {name!r}")


def resolve(name: str, where: str = "--device (train.device)") -> str:
    """``cpu`` or ``cuda``: what ``name`` means on this machine.

    ``auto`` is ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``; a
    request for ``cuda`` on a machine without one is a one-line UserError.
    """
    check_name(name, where)
    if name == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if name == "auto":
        return "cuda" if available else "cpu"
    if not available:
        raise UserError(f"{where} cuda: no CUDA device is available on this machine "
                        f"(torch {torch.__version__}); use --device cpu or auto")
    return "cuda"


def torch_device(name: str) -> torch.device:
    """The :class:`torch.device` of a ``--device`` name (resolved as by :func:`resolve`)."""
    import torch

    return torch.device(resolve(name))
