"""The ``imia`` attack: interaction-level membership inference by shadow retraining.

After Yuan, Yang, Nguyen, Cui, He and Yin, "Interaction-level Membership
Inference Attack Against Federated Recommender Systems", WWW 2023. The
honest-but-curious server knows what it sent client u (Q_sent), what u
uploaded, and the training recipe (learning rate, local epochs, batch size,
negatives ratio N, the optimiser, the BCE loss on sigmoid(p . q)); it does not
know u's positives, its sampled negatives, or its user vector p_u. It guesses
the labels, retrains a shadow copy of u's local training from Q_sent under
those guesses, keeps the guesses whose simulated item rows land closest to the
uploaded ones, and iterates.

Here, for each recorded client (vectorised over chunks of clients):

1. Trained rows: the rows the upload changed (exactly the trained rows when
   only trained rows move). When every row changed (noise on every entry, or
   FedEM's merge with the private local table), the rows whose change is a
   robust outlier (norm above median + ``outlier_mads`` MADs), at least
   1 + N rows. Candidates T: the trained rows; when every row changed and
   ``scope="all"`` (default), every row (the trained ones cannot be told
   apart, and under FedEM the merge shift makes the largest changes the
   untrained rows); ``scope="outliers"`` keeps the outliers only.
2. Expected positives K: a client with n positives samples N n negatives
   with replacement from the m - n other items, touching on average
   t(n) = n + (m - n)(1 - exp(-N n / (m - n))) distinct rows; K solves
   t(K) = (number of trained rows) by bisection. Epoch size K (1 + N) gives
   the number of batches.
3. Shadow training (each restart): a guessed user vector p' ~ N(0, s^2)
   (s = the public init std) and K guessed positives drawn at random. Every
   candidate row is simulated twice in parallel, once labelled 1 and once
   labelled 0, with Adam (fresh state, as the clients use), E epochs,
   ceil(K (1 + N) / B) batches per epoch in the attacker's own random order;
   p' is trained on the guessed labels only, so both copies of a row see the
   same p' trajectory (one row barely moves p').
4. Comparison: for each row, which simulated outcome is closer to the upload.
   Score z_i = <D_i, S1_i - S0_i> / ||S1_i - S0_i|| with D = upload - sent and
   S_y = the simulated row under label y minus its sent value: the
   log-likelihood ratio "label 1 vs 0" under isotropic Gaussian noise,
   without its item-dependent offset (||S1||^2 - ||S0||^2) / 2. Dropping the
   offset means that, when the upload is pure noise, every item's score has
   the same distribution, so no item prior hidden in the sent table (e.g.
   popularity) passes for membership (see :mod:`attacks.audit`).
5. Keep the K highest-scoring rows as the new guessed positives and repeat
   (``iterations`` times, or until the guesses stop changing).
6. Restarts: label flips (p' ~ -p_u with negatives guessed as positives) are
   also fixed points, so ``restarts`` random starts are run and, per client,
   the one whose simulated upload (rows under the final guesses) has the
   largest cosine with the observed delta is kept.

Scores: z on the candidate rows, divided by the client's root mean square of z
over T; rows outside T rank below every candidate of every client, ordered by
their change norm within a band common to all clients. NaN rows for clients
that did not take part. The attack simulates from Q_sent: FedEM clients start
from a private merged table instead, which this shadow does not model, so the
attack is weaker there by construction.

A shadow per backbone (``shadow``, a :class:`~attacks.shadow.ShadowModel`). The
steps above describe the built-in shadow, an MF client. The experiments layer
hands in the recorded backbone's own client training, built from its
registration (:mod:`fedem_private.experiments.shadow`; this package cannot
import the models): FedNCF's client with the MLP the server sent (recorded
with the observation, :attr:`Observation.sent_dense`), trained by Adam beside
the user vector; PFedRec's, whose batches step the private head first and the
item rows second; GPFedRec's, FedNCF's score with the MLP private (drawn as at
the start), without its regulariser toward the personalised table, which the
recording does not hold; FedRAP's, with the personal row of each item
travelling beside it and its two regularisers in the loss. What the server
cannot know it draws as the client would at the start: the user vector,
PFedRec's and FedRAP's head, GPFedRec's MLP, FedRAP's personal rows (the
backbone's own initialiser under the attacker's seed). Those are right in
round 1 (up to the draw) and guesses after it (the client kept training
them); as with MF, the iterations train the per-client ones on the guessed
labels. Backbones whose registration gives no shadow score keep the MF
shadow, and the record says so (``assumption``). MF's
registration asks for the built-in shadow (it is MF's client training, faster,
and measured stronger at ML-100K round 50 than the generic one; docs/attacks.md);
so does GPFedRec's, whose own shadow measured weaker than the MF one at round 50
(its private MLP, 50 rounds trained, against a start draw).
Upload codecs. Under FedPEFT's LoRA codec the client trains theta = (A, B) and item
i is base_i + B a_i: a changed B moves every decoded row, so in the decoded table
the trained rows no longer stand out. The server holds theta as sent and as decoded
from the upload (recorded with the observation, :attr:`Observation.sent_theta`),
hence each client's base (the sent table minus B a_i; E0 under static replacement),
and only the rows of A a client trained change. With ``codec="through"`` (the
default) the attack runs on the rows of A (:func:`lora_view`) with the backbone's
shadow trained through the codec (:func:`~attacks.shadow.through_lora`: a_i trains,
the base stays, B trains beside the backbone's own parameters). Under a merge the
client's base is private and the sent table's stands in for it; a backbone with
private rows (FedRAP) is not wrapped. The hash and RQ-VAE codecs share bucket rows
between items, so no row of theta is one item's: the attack reads their decoded
table as a heuristic, and the record says so (``assumption``).

Candidates with a backbone's shadow (``unchanged="shadow"``, the default): a
trained row need not change (FedNCF: a positive the client already scores with
sigmoid = 1 in float32, or a dead ReLU path, gets an exactly zero gradient, and
Adam leaves it where it was; at FedNCF round 50 about a third of the positives
stay unchanged), so "changed rows = trained rows" is not assumed. Every row is
a candidate and is simulated under both labels. A changed row is trained and
scored by z as above. An unchanged row the shadow would have moved (under
either label) is most likely untrained: it ranks below every candidate,
smaller simulated movement higher. An unchanged row the shadow also leaves
still says nothing, and keeps z = 0, between the likely positives and the
likely negatives among the changed rows; guessed positives are drawn from the
changed rows and these. The expected positive count K: the observed trained
rows are the share of the trained rows whose update shows; the shadow
estimates that share (the rows it moves among all rows, over the rows it moves
among the changed ones, which corrects for the rows it stalls only because its
private part is a guess), and K solves t(K) = (observed trained rows) / share,
re-estimated after each shadow run. Everything used is public or observed:
which rows changed, the sent tables, the public hyper-parameters.
``unchanged="below"`` keeps the MF shadow's candidates (the changed rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from .base import blank_nonparticipants
from .observations import Observation, PublicKnowledge
from .registry import Attack, Capabilities
from .shadow import LORA_B, ShadowModel, through_lora, train_shadow

BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8



#: the backbone the built-in shadow (no :class:`ShadowModel` handed in) reproduces
BUILTIN_BACKBONE = "mf"
#: a row moves in the shadow when its simulated change exceeds this fraction of lr
MOVE_TOL = 1e-3


def assumption_note(public: PublicKnowledge, shadow: ShadowModel | None = None, *,
                    through_codec: bool = True) -> str | None:
    """A one-line caveat when the shadow does not retrain the recorded backbone's client
    (another backbone, another optimiser, or a FedPEFT codec's parameters)."""
    notes = [n for n in (_backbone_note(public, shadow),
                         _codec_note(public, shadow if through_codec else None)) if n]
    return "; ".join(notes) if notes else None


def _codec_note(public: PublicKnowledge, shadow: ShadowModel | None = None) -> str | None:
    codec = public.extra.get("codec", "full")
    if codec in (None, "full"):
        return None
    if _trains_through_lora(public, shadow):
        if public.extra.get("merge", "sr") in (None, "sr"):
            return None
        return (f"codec 'lora' under merge {public.extra.get('merge')!r}: the client's frozen "
                "base (its merged table minus f_theta) is private; the shadow trains theta "
                "on the sent table's base")
    return (f"codec {codec!r}: after its warm-up the client trains the codec's parameters, "
            "which move every decoded row; the imia shadow replays the item table's own "
            "training, so its scores are a heuristic")


def _backbone_note(public: PublicKnowledge, shadow: ShadowModel | None) -> str | None:
    if shadow is not None and shadow.backbone == public.backbone:
        if public.optimizer != "adam":
            return (f"optimizer {public.optimizer!r}: the imia shadow replays Adam; its "
                    "scores are a heuristic")
        return None
    if shadow is None and public.backbone == BUILTIN_BACKBONE:
        return None
    return (f"backbone {public.backbone!r}: no shadow of this backbone's client training was "
            "handed to imia, so it retrains an MF client (sigmoid(p . q)); its scores are a "
            "heuristic")

def candidate_rows(norms: np.ndarray, min_rows: int, *, atol: float = 0.0,
                   outlier_mads: float = 6.0) -> np.ndarray:
    """(k, m) bool: the rows each client trained on, as far as the upload shows.

    Exactly the changed rows when some rows are unchanged; otherwise the
    robust outliers of the change norms (at least ``min_rows`` rows).
    """
    changed = norms > atol
    out = changed.copy()
    for j in np.flatnonzero(changed.all(axis=1)):
        row = norms[j]
        med = np.median(row)
        mad = 1.4826 * np.median(np.abs(row - med))
        pick = row > med + outlier_mads * mad
        if pick.sum() < min_rows:
            pick = np.zeros_like(pick)
            pick[np.argsort(-row, kind="stable")[:min_rows]] = True
        out[j] = pick
    return out


def expected_positives(touched: np.ndarray, n_items: int, num_negatives: int) -> np.ndarray:
    """Positives K with t(K) = touched, t(n) = n + (m - n)(1 - exp(-N n / (m - n)))."""
    t = np.asarray(touched, dtype=np.float64)
    if num_negatives == 0:
        return np.maximum(1, np.rint(t)).astype(np.int64)

    def distinct(n: np.ndarray) -> np.ndarray:
        rest = np.maximum(n_items - n, 1.0)
        return n + rest * (1.0 - np.exp(-num_negatives * n / rest))

    lo, hi = np.zeros_like(t), t.copy()
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = distinct(mid) < t
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.clip(np.rint(hi), 1, np.maximum(t, 1)).astype(np.int64)


def _batch_plan(valid: torch.Tensor, nb: torch.Tensor, epochs: int,
                gen: torch.Generator) -> torch.Tensor:
    """(c, E, R) batch index of every candidate slot in every epoch (-1 for padding)."""
    c, r = valid.shape
    size = valid.sum(1).clamp(min=1)
    out = torch.full((c, epochs, r), -1, dtype=torch.long, device=valid.device)
    for e in range(epochs):  # keys drawn on the CPU generator, used on valid's device
        keys = torch.rand((c, r), generator=gen).to(valid.device).masked_fill(~valid, 2.0)
        rank = torch.argsort(torch.argsort(keys, dim=1), dim=1)
        batch = torch.div(rank * nb[:, None], size[:, None], rounding_mode="floor")
        out[:, e] = torch.where(valid, batch, torch.full_like(batch, -1))
    return out


def _shadow(sent: torch.Tensor, valid: torch.Tensor, guess: torch.Tensor, p0: torch.Tensor,
            k_pos: torch.Tensor, public: PublicKnowledge, gen: torch.Generator
            ) -> torch.Tensor:
    """Simulated deltas (c, 2, R, d) of every candidate row under labels 0 and 1.

    Clients must come sorted by ``k_pos`` descending, so that the clients still
    training at any step are a prefix (as in the simulator's lock-step loop).
    Every tensor lives on ``sent``'s device; ``gen`` is a CPU generator.
    """
    c, r, d = sent.shape
    dev = sent.device
    n_neg = public.num_negatives
    epochs, lr = public.local_epochs, float(public.lr)
    per_epoch = k_pos * (1 + n_neg)
    nb = torch.div(per_epoch + public.batch_size - 1, public.batch_size,
                   rounding_mode="floor").clamp(min=1)
    steps = (epochs * nb).cpu().numpy()
    if np.any(np.diff(steps) > 0):
        raise ValueError("clients must be sorted by expected positives, descending")
    plan = _batch_plan(valid, nb, epochs, gen)
    weight = (per_epoch.double() / valid.sum(1).clamp(min=1).double()).float()
    q = sent.float()[:, None].expand(c, 2, r, d).contiguous()
    mq, vq, gq = torch.zeros_like(q), torch.zeros_like(q), torch.zeros_like(q)
    p = p0.float().contiguous()
    mp, vp, gp = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
    labels = torch.tensor([0.0, 1.0], device=dev)[None, :, None]
    g1 = guess.float()
    choose = torch.stack([1.0 - g1, g1], dim=1)  # (c, 2, R): the copy p' trains on
    b1, b2 = BETAS
    for s in range(int(steps[0])):
        a = int((steps > s).sum())  # clients still training: a prefix
        qa, pa = q[:a], p[:a]
        epoch = torch.div(s, nb[:a], rounding_mode="floor")
        mask = (plan[torch.arange(a, device=dev), epoch] == (s % nb[:a])[:, None]).float()
        count = (mask.sum(1) * weight[:a]).clamp(min=1.0)
        logits = torch.bmm(qa.view(a, 2 * r, d), pa[:, :, None]).view(a, 2, r)
        err = (torch.sigmoid(logits) - labels) * (mask / count[:, None])[:, None]
        torch.mul(err[..., None], pa[:, None, None, :], out=gq[:a])
        gp[:a] = torch.bmm((err * choose[:a]).view(a, 1, 2 * r), qa.view(a, 2 * r, d))[:, 0]
        step = torch.full((), float(s + 1), dtype=torch.float32, device=dev)  # as CUDA reads it
        torch._fused_adam_([qa, pa], [gq[:a], gp[:a]], [mq[:a], mp[:a]], [vq[:a], vp[:a]], [],
                           [step, step.clone()], lr=lr, beta1=b1, beta2=b2, weight_decay=0.0,
                           eps=ADAM_EPS, amsgrad=False, maximize=False)
    return (q - sent.float()[:, None]).double()


def _scores(delta: torch.Tensor, sim: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(c, R) z_i = <D_i, S1_i - S0_i> / ||S1_i - S0_i|| (0 on padding)."""
    diff = sim[:, 1] - sim[:, 0]
    norm = torch.linalg.vector_norm(diff, dim=2)
    z = (delta * diff).sum(2) / torch.where(norm > 0, norm, torch.ones_like(norm))
    return z.masked_fill(~valid, 0.0)


def _top_k(z: torch.Tensor, valid: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(c, R) bool: the k highest-scoring valid slots of each client."""
    order = torch.argsort(z.masked_fill(~valid, -math.inf), dim=1, descending=True,
                          stable=True)
    rank = torch.argsort(order, dim=1)
    return (rank < k_pos[:, None]) & valid


def _fit(delta: torch.Tensor, sim: torch.Tensor, guess: torch.Tensor) -> torch.Tensor:
    """(c,) cosine between the observed delta and the simulated one under the guesses."""
    c, _, r, d = sim.shape
    chosen = sim.gather(1, guess.long()[:, None, :, None].expand(c, 1, r, d)).squeeze(1)
    num = (delta * chosen).sum((1, 2))
    den = torch.linalg.vector_norm(delta.flatten(1), dim=1) * torch.linalg.vector_norm(
        chosen.flatten(1), dim=1)
    return num / torch.where(den > 0, den, torch.ones_like(den))


def _pack(cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each client's candidate rows, left-aligned: (row ids (c, R), valid (c, R)), R the
    largest candidate count (at least 1)."""
    c = cand.shape[0]
    r = int(max(cand.sum(1).max(), 1))
    idx = np.zeros((c, r), dtype=np.int64)
    valid = np.zeros((c, r), dtype=bool)
    for j in range(c):
        rows = np.flatnonzero(cand[j])
        idx[j, : rows.size] = rows
        valid[j, : rows.size] = True
    return idx, valid


def _unpack(packed: np.ndarray, idx: np.ndarray, valid: np.ndarray, m: int,
            fill: float) -> np.ndarray:
    """Inverse of :func:`_pack` for per-candidate values: (c, m), ``fill`` elsewhere."""
    out = np.full((packed.shape[0], m), fill)
    for j in range(packed.shape[0]):
        n = int(valid[j].sum())
        out[j, idx[j, :n]] = packed[j, :n]
    return out


def _attack_chunk(delta: np.ndarray, sent: np.ndarray, cand: np.ndarray, k_pos: np.ndarray,
                  public: PublicKnowledge, iterations: int, restarts: int, user_std: float,
                  gen: torch.Generator, device: str = "cpu") -> np.ndarray:
    """(c, m) raw z scores on candidates (NaN elsewhere) for a chunk of clients.

    The chunk's tensors live on ``device``; the random draws come from the CPU
    generator ``gen`` (the same numbers on every device) and are moved there.
    """
    c, m, d = delta.shape
    idx, valid_np = _pack(cand)
    r = idx.shape[1]
    take = np.arange(c)[:, None]
    dev = torch.device(device)
    valid = torch.from_numpy(valid_np).to(dev)
    dt = torch.from_numpy(delta[take, idx]).to(dev).double() * valid[..., None]
    st = torch.from_numpy(sent[take, idx].astype(np.float64)).to(dev)
    kp = torch.from_numpy(np.minimum(k_pos, valid_np.sum(1))).long().to(dev)
    best_fit = torch.full((c,), -math.inf, dtype=torch.float64, device=dev)
    best_z = torch.zeros((c, r), dtype=torch.float64, device=dev)
    for _ in range(restarts):
        p0 = (torch.randn((c, d), generator=gen, dtype=torch.float64) * user_std).to(dev)
        keys = torch.rand((c, r), generator=gen, dtype=torch.float64).to(dev)
        guess = _top_k(keys, valid, kp)
        z = torch.zeros((c, r), dtype=torch.float64, device=dev)
        sim = None
        for _ in range(max(iterations, 1)):
            sim = _shadow(st, valid, guess, p0, kp, public, gen)
            z = _scores(dt, sim, valid)
            new = _top_k(z, valid, kp)
            if torch.equal(new, guess):
                break
            guess = new
        assert sim is not None
        fit = _fit(dt, sim, guess)
        better = fit > best_fit
        best_fit = torch.where(better, fit, best_fit)
        best_z = torch.where(better[:, None], z, best_z)
    return _unpack(best_z.cpu().numpy(), idx, valid_np, m, np.nan)


def _attack_chunk_model(model: ShadowModel, delta: np.ndarray, sent: np.ndarray,
                        dense: dict[str, np.ndarray], cand: np.ndarray, trained: np.ndarray,
                        k_pos: np.ndarray, public: PublicKnowledge, iterations: int,
                        restarts: int, gen: torch.Generator, device: str = "cpu"
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_attack_chunk` with the backbone's own shadow (:mod:`attacks.shadow`).

    Returns (raw z (c, m), NaN off the candidates; each row's simulated movement
    (c, m): the larger norm of its two simulated deltas, 0 off the candidates).
    ``trained`` (c, m) marks the rows the upload shows trained: when some of
    them stay unchanged (:data:`MOVE_TOL`; a dead ReLU path leaves a trained row
    exactly where it was), the expected positives are re-estimated after each
    shadow run from the share of rows the shadow moves (see :func:`imia`).
    """
    c, m, d = delta.shape
    idx, valid_np = _pack(cand)
    r = idx.shape[1]
    take = np.arange(c)[:, None]
    dev = torch.device(device)
    valid = torch.from_numpy(valid_np).to(dev)
    seen = torch.from_numpy(trained[take, idx] & valid_np).to(dev)
    dt = torch.from_numpy(delta[take, idx]).to(dev).double() * valid[..., None]
    st = torch.from_numpy(sent[take, idx].astype(np.float64)).to(dev)
    n_seen = trained.sum(1)
    some_unchanged = n_seen < m
    kp0 = np.minimum(k_pos, valid_np.sum(1))
    best_fit = torch.full((c,), -math.inf, dtype=torch.float64, device=dev)
    best_z = torch.zeros((c, r), dtype=torch.float64, device=dev)
    best_move = torch.zeros((c, r), dtype=torch.float64, device=dev)
    lr = float(public.lr)
    for _ in range(restarts):
        theta = {n: v.to(dev) for n, v in model.init_private(c, gen).items()}
        if model.dense_names:
            if all(n in dense for n in model.dense_names):
                theta.update({n: torch.from_numpy(np.ascontiguousarray(dense[n])).to(dev)
                              for n in model.dense_names})
            else:  # a recording without the sent dense groups: the server's init, guessed
                theta.update({n: v.to(dev)[None].expand(c, *v.shape).contiguous()
                              for n, v in model.init_dense(gen).items()})
        # a private row per item (FedRAP's personal table), drawn as the client draws it
        rows0 = None if model.init_rows is None else model.init_rows(c, r, gen).to(dev)
        kp_np = kp0.copy()
        kp = torch.from_numpy(kp_np).long().to(dev)
        keys = torch.rand((c, r), generator=gen, dtype=torch.float64).to(dev)
        guess = _top_k(keys.masked_fill(~seen, -1.0), valid, kp)
        z = torch.zeros((c, r), dtype=torch.float64, device=dev)
        sim = None
        for _ in range(max(iterations, 1)):
            per_epoch = kp * (1 + public.num_negatives)
            sim = train_shadow(model, st, valid, guess, seen | guess, theta, per_epoch,
                               lr=lr, epochs=public.local_epochs,
                               batch_size=public.batch_size, gen=gen, rows0=rows0)
            z = _scores(dt, sim, valid)
            move = torch.linalg.vector_norm(sim, dim=3).amax(1)  # (c, R)
            moves = (move > MOVE_TOL * lr) & valid
            # the share of trained rows whose update shows, as the shadow sees it: the rows
            # it moves among all candidates, over those it moves among the rows seen trained
            # (its own error: it may stall rows with its guessed private part that the
            # client moved); the observed trained rows are that share of the rows trained
            all_share = moves.sum(1).double() / valid.sum(1).clamp(min=1).double()
            seen_share = (moves & seen).sum(1).double() / seen.sum(1).clamp(min=1).double()
            share = (all_share / seen_share.clamp(min=1e-12)).clamp(max=1.0).cpu().numpy()
            est = np.where(some_unchanged, n_seen / np.maximum(share, n_seen / m), n_seen)
            kp_np = np.minimum(expected_positives(np.minimum(est, m), m, public.num_negatives),
                               valid_np.sum(1))
            kp = torch.from_numpy(kp_np).long().to(dev)
            # guesses only among rows that can have been trained: changed, or left still
            # by the shadow (an unchanged row it moves was not trained)
            new = _top_k(z, valid & (seen | ~moves), kp)
            if torch.equal(new, guess):
                break
            guess = new
        assert sim is not None
        # the restart that explains the rows seen trained best (an unchanged row's simulated
        # change says nothing of the guessed private part's direction)
        fit = _fit(dt, sim * seen[:, None, :, None], guess)
        better = fit > best_fit
        best_fit = torch.where(better, fit, best_fit)
        best_z = torch.where(better[:, None], z, best_z)
        best_move = torch.where(better[:, None],
                                torch.linalg.vector_norm(sim, dim=3).amax(1), best_move)
    return (_unpack(best_z.cpu().numpy(), idx, valid_np, m, np.nan),
            _unpack(best_move.cpu().numpy(), idx, valid_np, m, 0.0))


def imia(obs: Observation, public: PublicKnowledge, *, iterations: int = 5, restarts: int = 3,
         atol: float = 0.0, outlier_mads: float = 6.0, user_std: float = 0.0, seed: int = 0,
         chunk: int = 32, scope: str = "all", device: str = "cpu",
         shadow: ShadowModel | None = None, unchanged: str = "shadow",
         codec: str = "through") -> np.ndarray:
    """(k, m) IMIA scores (see the module docstring); NaN rows for non-participants.

    ``user_std`` is the std of the guessed user vectors (0: the public
    ``init_std`` if recorded, else 0.1); ``seed`` drives only the attacker's own
    random choices (initial guesses, p', batch order), drawn on the CPU.
    ``device`` (``cpu`` or ``cuda``): where the shadow training runs.
    ``shadow``: the recorded backbone's client training (:class:`ShadowModel`,
    handed in by the experiments layer); None: the built-in MF shadow.
    ``unchanged`` (with ``shadow``): "shadow" simulates the unchanged rows too
    and ranks them by what the shadow says of them (module docstring,
    "Candidates"); "below" ranks them below the changed rows, as the MF shadow does.
    ``codec``: on a LoRA run with its parameters recorded, "through" attacks the rows of
    A with the shadow trained through the codec (:func:`lora_view`); "decoded" attacks
    the decoded table as for a run without a codec (the shadow then replays the table's
    own training, a heuristic).
    """
    if codec not in ("through", "decoded"):
        raise ValueError(f"codec must be 'through' or 'decoded', got {codec!r}")
    if unchanged not in ("shadow", "below"):
        raise ValueError(f"unchanged must be 'shadow' or 'below', got {unchanged!r}")
    if iterations < 1 or restarts < 1 or chunk < 1:
        raise ValueError("iterations, restarts and chunk must be >= 1")
    if atol < 0 or outlier_mads <= 0 or user_std < 0:
        raise ValueError("need atol >= 0, outlier_mads > 0, user_std >= 0")
    if scope not in ("all", "outliers"):
        raise ValueError(f"scope must be 'all' or 'outliers', got {scope!r}")
    lora = lora_view(obs, public, shadow) if codec == "through" else None
    if lora is not None:  # rows of A and the shadow through the codec (module docstring)
        obs, shadow = lora
    std = user_std or float(public.extra.get("init_std", 0.1))
    k, m = obs.n_clients, obs.n_items
    scores = np.zeros((k, m), dtype=np.float64)
    part = np.flatnonzero(obs.participated)
    if part.size == 0:
        return blank_nonparticipants(scores, obs)
    norms = np.empty((k, m))
    for start in range(0, k, chunk):
        stop = min(start + chunk, k)
        norms[start:stop] = np.linalg.norm(obs.delta(start, stop), axis=2)
    trained = candidate_rows(norms, 1 + public.num_negatives, atol=atol,
                             outlier_mads=outlier_mads)
    k_pos = expected_positives(trained.sum(1), m, public.num_negatives)
    cand = trained.copy()
    if scope == "all":
        cand[(norms > atol).all(axis=1)] = True
    gen = torch.Generator().manual_seed(int(seed))
    if shadow is not None:
        return _imia_model(obs, public, shadow, norms, trained, k_pos, part, iterations,
                           restarts, atol, chunk, scope, gen, device, scores,
                           every_row=unchanged == "shadow")
    order = part[np.argsort(-k_pos[part], kind="stable")]  # lock-step needs K descending
    raw = np.full((k, m), np.nan)
    for start in range(0, order.size, chunk):
        rows = order[start: start + chunk]  # most candidates first (prefix lock-step)
        delta = obs.upload[rows].astype(np.float64) - obs.sent[rows].astype(np.float64)
        raw[rows] = _attack_chunk(delta, np.asarray(obs.sent[rows]), cand[rows], k_pos[rows],
                                  public, iterations, restarts, std, gen, device)
    for j in part:
        zc = raw[j, cand[j]]
        rms = math.sqrt(float(np.mean(zc**2))) if zc.size else 1.0
        scores[j, cand[j]] = zc / (rms if rms > 0 else 1.0)
    # rows outside T: below every candidate of every client, on one scale for all clients
    # (a per-client offset would make pooled scores depend on each client's extremes)
    on = cand[part]
    floor = float(scores[part][on].min()) - 1.0 if on.any() else 0.0
    for j in part:
        off = norms[j, ~cand[j]]
        top = float(off.max()) if off.size and off.max() > 0 else 1.0
        scores[j, ~cand[j]] = floor - 1.0 + 0.5 * off / top
    return blank_nonparticipants(scores, obs)


def _trains_through_lora(public: PublicKnowledge, shadow: ShadowModel | None) -> bool:
    """Whether a LoRA run's shadow can be trained through the codec
    (:func:`~attacks.shadow.through_lora`: a backbone shadow without private rows)."""
    return public.extra.get("codec") == "lora" and shadow is not None and \
        shadow.init_rows is None


def lora_view(obs: Observation, public: PublicKnowledge, shadow: ShadowModel | None
              ) -> tuple[Observation, ShadowModel] | None:
    """A LoRA round seen in the codec's own rows: (the observation whose row i is
    [a_i | base_i], sent and uploaded, with B as a sent dense group; the shadow trained
    through the codec, :func:`~attacks.shadow.through_lora`), or None when the round has
    no LoRA parameters recorded or no backbone shadow to wrap.

    The server holds the sent and decoded theta (A (m, k_L), B (d, k_L) per client) and
    the table they decode to, sent_i = base_i + B a_i, hence each client's frozen base.
    Only the rows of A that the client trained change (dA_i = B^T g_i; B moves every
    decoded row, which is what hides the trained rows in the decoded table)."""
    if not _trains_through_lora(public, shadow) or not {"A", "B"} <= set(obs.sent_theta):
        return None
    assert shadow is not None
    a0 = np.asarray(obs.sent_theta["A"], dtype=np.float64)
    a1 = np.asarray(obs.upload_theta["A"], dtype=np.float32)
    b0 = np.asarray(obs.sent_theta["B"], dtype=np.float64)
    base = (obs.sent.astype(np.float64) - np.einsum("kmr,kdr->kmd", a0, b0)).astype(np.float32)
    view = Observation(obs.round, obs.clients,
                       np.concatenate([a0.astype(np.float32), base], axis=2),
                       np.concatenate([a1, base], axis=2), obs.participated,
                       {**obs.sent_dense, LORA_B: obs.sent_theta["B"]})
    return view, through_lora(shadow, a0.shape[2], obs.dim)


def _imia_model(obs: Observation, public: PublicKnowledge, model: ShadowModel,
                norms: np.ndarray, trained: np.ndarray, k_pos: np.ndarray, part: np.ndarray,
                iterations: int, restarts: int, atol: float, chunk: int, scope: str,
                gen: torch.Generator, device: str, scores: np.ndarray,
                every_row: bool = True) -> np.ndarray:
    """:func:`imia` with the backbone's own shadow; candidates: every row (see the module
    docstring, "Candidates"), or with ``every_row`` False the MF shadow's candidates."""
    k, m = obs.n_clients, obs.n_items
    every = (norms > atol).all(axis=1)
    cand = np.ones((k, m), dtype=bool)
    if not every_row:
        cand = trained.copy()
        if scope == "all":
            cand[every] = True
    elif scope == "outliers":
        cand[every] = trained[every]
    raw = np.full((k, m), np.nan)
    moved = np.zeros((k, m))
    for start in range(0, part.size, chunk):
        rows = part[start: start + chunk]
        delta = obs.upload[rows].astype(np.float64) - obs.sent[rows].astype(np.float64)
        dense = {n: np.asarray(v[rows], dtype=np.float32) for n, v in obs.sent_dense.items()}
        raw[rows], moved[rows] = _attack_chunk_model(
            model, delta, np.asarray(obs.sent[rows]), dense, cand[rows], trained[rows],
            k_pos[rows], public, iterations, restarts, gen, device)
    tol = MOVE_TOL * float(public.lr)
    # an unchanged row the shadow moves had it been trained: most likely untrained (ranked
    # below every candidate); one the shadow leaves still too tells nothing (its z is 0)
    ruled_out = (norms <= atol) & (moved > tol) & ~every[:, None]
    for j in part:
        keep = cand[j] & ~ruled_out[j]
        zc = raw[j, keep]
        zs = raw[j, keep & (norms[j] > atol)]
        rms = math.sqrt(float(np.mean(zs**2))) if zs.size else 1.0
        scores[j, keep] = zc / (rms if rms > 0 else 1.0)
    on = cand[part] & ~ruled_out[part]
    floor = float(scores[part][on].min()) - 1.0 if on.any() else 0.0
    for j in part:
        off = ~(cand[j] & ~ruled_out[j])
        far = np.where(cand[j], moved[j], norms[j])[off]  # the predicted (or seen) movement
        top = float(far.max()) if far.size and far.max() > 0 else 1.0
        if cand[j][off].all():  # unchanged rows the shadow moves: less movement ranks higher
            scores[j, off] = floor - 1.0 - 0.5 * far / top
        else:
            scores[j, off] = floor - 1.0 + 0.5 * norms[j, off] / max(
                float(norms[j, off].max()), 1e-300)
    return blank_nonparticipants(scores, obs)


@dataclass(frozen=True)
class ImiaOptions:
    """The knobs of :func:`imia` at the settings ``fedem-private attack`` has always used."""

    iterations: int = 5
    restarts: int = 3
    atol: float = 0.0
    outlier_mads: float = 6.0
    user_std: float = 0.0
    seed: int = 0
    chunk: int = 32
    scope: str = "all"
    unchanged: str = "shadow"
    codec: str = "through"


class ImiaAttack(Attack):
    """Registration of :func:`imia` (Yuan et al., WWW 2023): reads the uploads and the sent
    tables, retrains the backbone's shadow on the device."""

    options = ImiaOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        kind="item", observes=("uploads", "released-aggregate"), device=True, shadow=True)
    function = staticmethod(imia)

    @classmethod
    def assumption(cls, public: PublicKnowledge, shadow: ShadowModel | None = None,
                   options: ImiaOptions | None = None) -> str | None:
        """:func:`assumption_note` (``codec="decoded"``: the codec note as without a shadow
        through the codec)."""
        through = options is None or options.codec == "through"
        return assumption_note(public, shadow, through_codec=through)
