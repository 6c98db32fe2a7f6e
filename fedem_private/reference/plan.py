"""A chunk's lock-step plan built one client, one step at a time: the reference
:func:`~fedem_private.models.base.make_plan` is tested against."""

from __future__ import annotations

import numpy as np

from fedem_private.models.base import ClientSamples, LocalTrainConfig, epoch_orders, num_steps


def reference_plan(seed: int, round_: int, clients: np.ndarray, samples: ClientSamples,
                   cfg: LocalTrainConfig, n_items: int | None = None) -> dict[str, object]:
    """The plan of :func:`make_plan` as numpy arrays, written plainly.

    Client j trains on its sorted unique items (every item with ``n_items``); its step s
    is batch s mod NB_j of epoch s // NB_j, positions b B .. b B + B - 1 of that epoch's
    order (:func:`epoch_orders`, the per-client order reference); slots are laid out
    step-major, the clients still training at step s in chunk order. Returns ``ids``
    (list of each client's trained items), ``rows``, ``loc``, ``lab``, ``wgt``,
    ``active``, ``offsets``, ``steps``.
    """
    k, bsz = len(clients), cfg.batch_size
    per_client = []
    for j, c in enumerate(np.asarray(clients).tolist()):
        items, labels = samples.of(j)
        ids = np.arange(n_items) if n_items is not None else np.unique(items)
        pos_of = {int(item): r for r, item in enumerate(ids.tolist())}
        orders = epoch_orders(seed, round_, c, items.shape[0], cfg.epochs, samples.stream)
        nb = -(-items.shape[0] // bsz)
        batches = []
        for s in range(cfg.epochs * nb):
            epoch, b = divmod(s, nb)
            picked = orders[epoch][b * bsz: (b + 1) * bsz]
            batches.append([(pos_of[int(items[p])], float(labels[p])) for p in picked])
        per_client.append((ids, batches))
    rows = max((ids.shape[0] for ids, _ in per_client), default=1) or 1
    steps = num_steps(np.diff(samples.indptr), cfg)
    loc, lab, wgt, active, offsets = [], [], [], [], [0]
    for s in range(int(steps.max(initial=0))):
        here = [j for j in range(k) if s < len(per_client[j][1])]
        active.append(len(here))
        offsets.append(offsets[-1] + len(here))
        for j in here:
            batch = per_client[j][1][s]
            row_loc, row_lab, row_wgt = np.zeros(bsz, np.int64), np.zeros(bsz), np.zeros(bsz)
            for i, (r, y) in enumerate(batch):
                row_loc[i], row_lab[i], row_wgt[i] = j * rows + r, y, 1.0 / len(batch)
            row_loc[len(batch):] = j * rows
            loc.append(row_loc)
            lab.append(row_lab)
            wgt.append(row_wgt)
    empty = np.zeros((0, bsz))
    return {"ids": [ids for ids, _ in per_client], "rows": rows,
            "loc": np.array(loc, dtype=np.int64).reshape(-1, bsz) if loc else empty,
            "lab": np.array(lab).reshape(-1, bsz) if lab else empty,
            "wgt": np.array(wgt).reshape(-1, bsz) if wgt else empty,
            "active": np.array(active, dtype=np.int64), "offsets": np.array(offsets),
            "steps": steps}
