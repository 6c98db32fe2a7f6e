"""The strong non-federated models of the accuracy axis (docs/design.md section 14): EASE, implicit
ALS and the federated backbone (MF) trained centrally on the pooled training data.

Each function returns the (n_users, n_items) score matrix of a model fitted on the
training interactions only (validation and test items are never seen).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedem_private.data.negatives import sample_excluding
from fedem_private.data.split import Split, exclusion_csr
from fedem_private.errors import UserError


def interaction_matrix(split: Split) -> np.ndarray:
    """X (n, m) float64 with X_ui = 1 for u's training items."""
    x = np.zeros((split.n_users, split.n_items), dtype=np.float64)
    x[np.repeat(np.arange(split.n_users), split.train_counts), split.train_items] = 1.0
    return x


def ease_weights(x: np.ndarray, lam: float) -> np.ndarray:
    """EASE's item-item weights (Steck 2019, equation 8 and its closed form):

        P = (X'X + lambda I)^-1,   B = I - P diagMat(1 / diag P),

    i.e. B_ij = -P_ij / P_jj off the diagonal and B_jj = 0 (the zero-diagonal constraint).
    """
    if not lam > 0:
        raise ValueError(f"lambda must be > 0, got {lam}")
    g = x.T @ x
    g[np.diag_indices_from(g)] += lam
    p = np.linalg.inv(g)
    b = -p / np.diag(p)[None, :]
    b[np.diag_indices_from(b)] = 0.0
    return b


def ease_scores(split: Split, lam: float) -> np.ndarray:
    """S = X B (Steck 2019): each user's training row through the item-item weights."""
    x = interaction_matrix(split)
    return x @ ease_weights(x, lam)


def als_scores(split: Split, factors: int, regularization: float, iterations: int,
               alpha: float, seed: int) -> np.ndarray:
    """Implicit-feedback ALS (Hu, Koren and Volinsky 2008) by the ``implicit`` library.

    Preference 1 on training pairs (0 elsewhere), confidence 1 + alpha on them; the
    scores are the user factors times the item factors. One thread, seeded.
    """
    try:
        from implicit.cpu.als import AlternatingLeastSquares
    except ImportError:
        raise UserError("method 'als' needs the implicit library: pip install "
                        "'fedem-private[baselines]' (or pip install implicit)") from None
    from scipy import sparse

    x = sparse.csr_matrix(
        (np.ones(split.train_items.shape[0], dtype=np.float32), split.train_items,
         split.train_indptr), shape=(split.n_users, split.n_items))
    model = AlternatingLeastSquares(factors=factors, regularization=regularization,
                                    alpha=alpha, iterations=iterations, random_state=seed,
                                    num_threads=1, calculate_training_loss=False)
    model.fit(x, show_progress=False)
    return np.asarray(model.user_factors, dtype=np.float64) @ np.asarray(
        model.item_factors, dtype=np.float64).T


def centralised_mf_scores(split: Split, protocol: str, *, dim: int, lr: float,
                          batch_size: int, num_negatives: int, init_std: float, epochs: int,
                          seed: int) -> np.ndarray:
    """FedMF's backbone and loss trained on the pooled training data (no federation).

    Score sigmoid(p_u . q_i) (FedEM paper, equation 2); loss the mean binary
    cross-entropy over batches of positives and sampled negatives (equation 12);
    Adam at ``lr``. Each epoch visits every training positive once with
    ``num_negatives`` negatives drawn afresh from the items the protocol allows
    (strict: outside u's training set; paper: outside all of u's interactions), in a
    seeded random order. p_u and q_i start from N(0, init_std^2).
    """
    gen = np.random.default_rng(np.random.SeedSequence([int(seed), 4206]))
    torch_gen = torch.Generator().manual_seed(int(seed))
    p = torch.nn.Parameter(torch.randn(split.n_users, dim, generator=torch_gen) * init_std)
    q = torch.nn.Parameter(torch.randn(split.n_items, dim, generator=torch_gen) * init_std)
    opt = torch.optim.Adam([p, q], lr=lr)
    indptr, excluded = exclusion_csr(split, protocol)
    pos_users = np.repeat(np.arange(split.n_users), split.train_counts)
    pos_items = split.train_items
    for _ in range(epochs):
        neg_users = np.repeat(pos_users, num_negatives)
        neg_items = sample_excluding(indptr, excluded, split.n_items, neg_users,
                                     gen.random(neg_users.shape[0]))
        users = torch.from_numpy(np.concatenate([pos_users, neg_users]))
        items = torch.from_numpy(np.concatenate([pos_items, neg_items]).astype(np.int64))
        labels = torch.cat([torch.ones(pos_users.shape[0]), torch.zeros(neg_users.shape[0])])
        order = torch.from_numpy(gen.permutation(users.shape[0]))
        for start in range(0, order.shape[0], batch_size):
            idx = order[start:start + batch_size]
            u, i = users[idx], items[idx]
            logits = (p[u] * q[i]).sum(dim=1)
            loss = F.binary_cross_entropy_with_logits(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    with torch.no_grad():
        return (p @ q.T).double().numpy()
