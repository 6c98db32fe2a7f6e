"""Slow, obvious reference implementations the fast path is tested against.

Each module holds the plain version of one room's vectorised code: one client
(or one pair, one table) at a time, ``torch.optim`` instead of fused steps,
cvxpy instead of a closed form, loops instead of batched linear algebra.
Nothing here is batched or clever on purpose. The tests compare the fast path
with these (same seeds, same tables) and the speed benchmarks time it against
them; no production module imports this package (an import-linter contract in
pyproject.toml), so they can stay simple and slow.

- :mod:`~fedem_private.reference.models`: each backbone's local training and
  logits, one client at a time (``reference_train_client``, ``reference_logits``),
  and the batches and optimisers they share;
- :mod:`~fedem_private.reference.merging`: an MF client's round with the merge
  on every batch (:class:`~fedem_private.client.merging.BatchMergeRows`);
- :mod:`~fedem_private.reference.codecs`: FedPEFT's decode-then-full-table
  training (:class:`~fedem_private.client.codecs.PeftRows`);
- :mod:`~fedem_private.reference.aggregation`: similarity weights by cvxpy
  (equation 13, and the FedEM code's PCA similarity with sklearn);
- :mod:`~fedem_private.reference.graph`: GPFedRec's user graph, pair by pair;
- :mod:`~fedem_private.reference.fedmerge`: the FedMerge fit, client by client;
- :mod:`~fedem_private.reference.plan`: a chunk's lock-step plan, one client and one
  step at a time (:func:`~fedem_private.models.base.make_plan`);
- :mod:`~fedem_private.reference.round`: a whole round of a
  :class:`~fedem_private.simulation.loop.Simulation`, one client at a time.

The per-client DP-SGD references (opacus) are still in
:mod:`fedem_private.privacy.dpsgd`.
"""
