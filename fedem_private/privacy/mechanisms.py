"""The per-round release of client uploads: the noise primitives and one release function
per local privacy mode, which the mechanism classes of :mod:`fedem_private.privacy.mech`
call as their client-side hook.

Every function has the signature ``(params, sent, local, *, seed, round_,
clients, touched=None) -> (released, RoundPrivacyStats)``: ``sent`` and
``local`` are (k, m, d) tables of the k clients ``clients`` (what the server
sent, what local training produced); ``released`` is the (k, m, d) float32
upload. Threat model (docs/design.md section 5): the server sees every upload,
what it sent and who took part. Neighbouring relation for the guarantees
(local DP): replace-one, the client's whole dataset replaced by any other.

The steps are separate: the delta local - sent is formed and clipped in
float64 (:mod:`clipping`), then noise for all k clients is drawn in one call
of ``rng.client_noise`` keyed by (seed, round, client), added, and the sum
cast to float32 (post-processing).

Devices: clipping and the noise addition run on the device of the tables
(the run's); the noise is drawn on the CPU, bit for bit as on a CPU run, and
moved there.

The central mode cdp-gaussian releases no upload at all; its clipping and
its one noise draw on the sum live in :mod:`central`.

What the guarantees do not cover: they are for the idealised real-valued
mechanism. Noise comes from a seeded statistical PRNG and is added in
floating point (no snapping, cf. Mironov 2012), which is fine for a
simulator and not for deployment.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from fedem_private import rng
from fedem_private.errors import Diverged
from fedem_private.finite import finite_rows
from fedem_private.privacy.clipping import ClipStats, clip_rows
from fedem_private.privacy.params import MechanismParams
from fedem_private.privacy.types import RoundPrivacyStats  # noqa: F401  (re-exported)

Release = Callable[..., tuple[torch.Tensor, RoundPrivacyStats]]


def _check_inputs(sent: torch.Tensor, local: torch.Tensor, clients: np.ndarray,
                  touched: torch.Tensor | None, need_touched: bool) -> np.ndarray:
    ids = np.asarray(clients)
    if sent.shape != local.shape or sent.dim() < 2:
        raise ValueError(f"sent {tuple(sent.shape)} and local {tuple(local.shape)} must match")
    if ids.shape != (local.shape[0],):
        raise ValueError(f"clients has shape {ids.shape}, expected ({local.shape[0]},)")
    if need_touched:
        if touched is None or touched.dtype != torch.bool or local.dim() != 3 \
                or tuple(touched.shape) != tuple(local.shape[:2]):
            raise ValueError("touched must be a (k, m) bool tensor for (k, m, d) tables")
    # ``sent`` is the server's own table, built from uploads already checked here
    finite = finite_rows(local)
    if not bool(finite.all()):
        bad = ids[(~finite).cpu().numpy()].tolist()
        raise Diverged(f"non-finite value (NaN or Inf) in the local table of client(s) "
                        f"{bad[:10]}")
    return ids


def clipped_delta(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor
                  ) -> tuple[torch.Tensor, ClipStats]:
    """clip_p(local - sent, C) in float64, per client (p = params.norm)."""
    assert params.norm is not None and params.clip is not None
    delta = local.detach().to(torch.float64, copy=True)
    delta.sub_(sent.detach())
    return clip_rows(delta, params.clip, params.norm)


def draw_noise(params: MechanismParams, shape: torch.Size, *, seed: int, round_: int,
               clients: np.ndarray, device: torch.device | None = None) -> torch.Tensor | None:
    """(k, ...) float64 noise of params.noise_kind / noise_scale, one rng call for all
    k clients, keyed by (seed, round, client); None when the scale is 0.

    Drawn on ``device`` (None: the CPU) by the keyed generator's tensor form
    (docs/design.md section 16): the uniforms are the same bits on every device.
    """
    if params.noise_scale == 0 or params.noise_kind is None:
        return None
    n = math.prod(shape[1:])
    noise = rng.client_noise(seed, round_, clients, n, params.noise_kind, params.noise_scale,
                             device=device)
    return noise.reshape(shape)


def noise_std(params: MechanismParams) -> float:
    """Standard deviation of one entry's noise: b sqrt(2) (Laplace), sigma (Gaussian), 0."""
    if params.noise_scale <= 0 or params.noise_kind is None:
        return 0.0
    return params.noise_scale * (math.sqrt(2.0) if params.noise_kind == "laplace" else 1.0)


def mean_abs_trained(delta: torch.Tensor, touched: torch.Tensor | None) -> float | None:
    """Mean over clients of the mean |delta| on the entries of its trained rows.

    delta (k, m, d); touched (k, m) bool. Clients that trained no row are left
    out; None if no client trained one (or ``touched`` is not given).
    """
    if touched is None or delta.shape[0] == 0:
        return None
    rows = touched.to(torch.float64)
    n_rows = rows.sum(dim=1)
    keep = n_rows > 0
    if not bool(keep.any()):
        return None
    per_row = delta.abs().to(torch.float64).sum(dim=2)  # (k, m)
    per_client = (per_row * rows).sum(dim=1)[keep] / (n_rows[keep] * delta.shape[2])
    return float(per_client.mean())


def _stats(params: MechanismParams, k: int, clip: ClipStats | None,
           noised_fraction: float, signal: float | None = None) -> RoundPrivacyStats:
    return RoundPrivacyStats(
        mode=params.mode,
        n_clients=k,
        norm=params.norm,
        clip=params.clip,
        fraction_clipped=None if clip is None else clip.fraction_clipped,
        mean_pre_clip_norm=None if clip is None else clip.mean_norm,
        noise_kind=params.noise_kind if params.noise_scale > 0 else None,
        noise_scale=params.noise_scale,
        noised_fraction=noised_fraction,
        clip_stats=clip,
        mean_abs_delta_trained=signal,
    )


def release_none(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                 seed: int, round_: int, clients: np.ndarray,
                 touched: torch.Tensor | None = None) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """Mode none: upload ``local`` as is (the same tensor). No privacy guarantee."""
    _check_inputs(sent, local, clients, touched, need_touched=False)
    return local, _stats(params, local.shape[0], None, 0.0)


def _clip_and_noise(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor,
                    seed: int, round_: int, clients: np.ndarray,
                    mask: torch.Tensor | None, touched: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """sent + clip(local - sent, C) + noise (noise times ``mask`` if one is given).

    ``touched`` (k, m) bool, when given, only feeds the noise-to-signal
    statistic (:func:`mean_abs_trained`); it never changes the release.
    """
    out, clip = clipped_delta(params, sent, local)
    signal = mean_abs_trained(out, touched)
    out.add_(sent.detach())
    noise = draw_noise(params, out.shape, seed=seed, round_=round_, clients=clients,
                       device=out.device)
    noised = 0.0
    if noise is not None:
        if mask is None:
            noised = 1.0
        else:
            noise.mul_(mask.unsqueeze(-1))
            noised = float(mask.double().mean()) if mask.numel() else 0.0
        out.add_(noise)
    return out.to(torch.float32), _stats(params, out.shape[0], clip, noised, signal)


def release_ldp_laplace(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                        seed: int, round_: int, clients: np.ndarray,
                        touched: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """Mode ldp-laplace: sent + clip_1(local - sent, C) + Lap(b) on ALL m x d entries.

    Neighbouring relation: replace-one (local DP), the client's whole dataset
    replaced by any other. Sensitivity: both clipped deltas lie in the L1
    ball of radius C, so the L1 sensitivity is 2C; ``sent`` is public, so the
    release covers everything private that shaped the delta (the merge with
    the client's previous model, its adapter). With b = 2C / eps_round each
    round is eps_round-DP (pure). b = 0 (eps = inf): clipped, no noise, no
    guarantee. ``touched`` only feeds the noise-to-signal statistic.
    """
    _check_inputs(sent, local, clients, touched, need_touched=False)
    return _clip_and_noise(params, sent, local, seed, round_, clients, None, touched)


def release_ldp_gaussian(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                         seed: int, round_: int, clients: np.ndarray,
                         touched: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """Mode ldp-gaussian: sent + clip_2(local - sent, C) + N(0, sigma^2) on all entries.

    Neighbouring relation: replace-one (local DP). L2 sensitivity 2C (both
    clipped deltas lie in the L2 ball of radius C). sigma = z * 2C; the
    (eps, delta) guarantee comes from accounting (:mod:`accounting`), one
    round being the Gaussian mechanism with mu = 1/z.
    """
    _check_inputs(sent, local, clients, touched, need_touched=False)
    return _clip_and_noise(params, sent, local, seed, round_, clients, None, touched)


def release_touched_rows(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                         seed: int, round_: int, clients: np.ndarray,
                         touched: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """Mode ldp-touched-rows, INSECURE: sent + clip_1(local - sent, C) + Lap(b) on touched rows.

    Kept to show the leak. Rows with ``touched`` False are released as
    sent + clipped delta without noise, so which rows differ from ``sent``
    (and by how much) is visible exactly. Under replace-one the touched set
    itself changes, so there is NO DP guarantee at any noise level; the L1
    sensitivity 2C and b = 2C / eps_round are only what the mode claims.
    """
    _check_inputs(sent, local, clients, touched, need_touched=True)
    assert touched is not None
    return _clip_and_noise(params, sent, local, seed, round_, clients, touched.to(torch.float64),
                           touched)


def release_paper(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                  seed: int, round_: int, clients: np.ndarray,
                  touched: torch.Tensor | None = None) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """Mode paper (the FedEM paper's recipe): local + Lap(lambda) on all m x d entries.

    The gradient clip at Z happens inside local training (the engine's job).
    The paper's figure eps_u = S_u / lambda with S_u = 2 p_u eta Z is a
    HEURISTIC (see ``params.paper_heuristic_epsilon``), not a guarantee: it
    bounds one SGD step, not E epochs of Adam, so under replace-one the
    sensitivity of the uploaded table is not bounded and no DP is claimed.
    """
    _check_inputs(sent, local, clients, touched, need_touched=False)
    out = local.detach().to(torch.float64, copy=True)
    noise = draw_noise(params, out.shape, seed=seed, round_=round_, clients=clients,
                       device=out.device)
    if noise is not None:
        out.add_(noise)
    return out.to(torch.float32), _stats(params, out.shape[0], None, 1.0 if noise is not None
                                         else 0.0)


def release_dpsgd(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *,
                  seed: int, round_: int, clients: np.ndarray,
                  touched: torch.Tensor | None = None) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """ldp-dpsgd: the upload is the DP-SGD-trained table as is (post-processing; the noise
    went into every local step, see :mod:`fedem_private.privacy.dpsgd`)."""
    _check_inputs(sent, local, clients, touched, need_touched=False)
    return local, _stats(params, local.shape[0], None, 1.0 if params.noise_scale > 0 else 0.0)


def release(params: MechanismParams, sent: torch.Tensor, local: torch.Tensor, *, seed: int,
            round_: int, clients: np.ndarray, touched: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, RoundPrivacyStats]:
    """The client-side hook of ``params.mode``'s mechanism
    (:meth:`~fedem_private.privacy.mech.base.Mechanism.release`)."""
    return params.mechanism.release(params, sent, local, seed=seed, round_=round_,
                                    clients=clients, touched=touched)
