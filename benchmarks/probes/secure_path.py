"""Issue 77's two audits of the secure path, run on whatever tree is importable.

1. Unmasking: a tiny ddp-skellam run (12 bits) records its last round; an attacker who
   holds the run seed re-derives every client's secure-aggregation secrets the way the code
   before issue 77 keyed them (``rng.key(seed, 1102, round, client)``) and removes the
   masks. Printed: the chi-square p-value that the top 3 bits of the "recovered" inputs are
   uniform, and their largest centred magnitude (inputs are small integers around 0; masked
   values are uniform over +-2^(b-1)).
2. Removal: the 200-user / 80-item world with and without its last user under dp-ftrl
   (eps 4, clip 1, q = 0.25, 4 rounds), the public divisor fixed at q 200 = 50 in both
   worlds; each round's noise-cancelled aggregate gap in units of C (B's releases replayed
   into A, as the neighbour-world harness does).

It uses only what both the code before and after the fix have, so the same command
measures both: run it from a checkout, or
with ``PYTHONPATH`` at a worktree of the older commit. ``tests/test_secure_path.py``
asserts the "after" side. Usage: ``python -m benchmarks.probes.secure_path``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from fedem_private import rng
from fedem_private.data import SyntheticConfig, generate, leave_one_out
from fedem_private.data.split import Split
from fedem_private.experiments import neighbours as nb
from fedem_private.experiments.recording import RecordSpec, recording_setup
from fedem_private.privacy import layer as privacy_layer
from fedem_private.privacy import secagg
from fedem_private.simulation.loop import Simulation

BITS = 12
OLD_KEYS = 1102  # the key stream the secrets were derived from before issue 77


def audit_secrets(seed: int, round_: int, u: int) -> tuple[bytes, bytes]:
    k = int(rng.key(seed, OLD_KEYS, round_, u)).to_bytes(8, "little")
    return (secagg._hkdf(k, b"fedem secagg beta", secagg.SEED_BYTES),
            secagg._hkdf(k, b"fedem secagg sigma", secagg.SEED_BYTES))


def unmask(tr: dict[str, np.ndarray], seed: int) -> np.ndarray:
    r, bits = int(tr["round"]), int(tr["bits"])
    cohort = tr["cohort"].astype(np.int64)
    nbrs = secagg.graph(cohort, secagg.default_degree(cohort.size), seed=seed, round_=r)
    mod, length = np.uint64(1 << bits), tr["masked"].shape[1]
    pub = {v: secagg._raw(secagg._mask_key(audit_secrets(seed, r, v)[1]).public_key())
           for v in cohort.tolist()}
    out = []
    for u, row in zip(tr["recorded_senders"].tolist(), tr["masked"], strict=True):
        beta, sigma = audit_secrets(seed, r, u)
        y = row.astype(np.uint64) + mod - secagg.prg(beta, length, bits).astype(np.uint64)
        key = secagg._mask_key(sigma)
        for v in nbrs[u].tolist():
            mask = secagg.prg(secagg._pair_key(key, pub[v], r, b"fedem secagg mask"),
                              length, bits).astype(np.uint64)
            y = y + (mod - mask) if u < v else y + mask
        out.append((y % mod).astype(np.int64))
    return np.stack(out)


def unmasking() -> tuple[float, int]:
    cfg = nb.make_config("ddp-skellam", settings={
        "clip": 1.0, "epsilon": 4.0, "sample_rate": 0.8, "ddp_bits": BITS})
    sim = Simulation(cfg, nb.base_split())
    run_dir = Path(tempfile.mkdtemp())
    recording_setup(RecordSpec(("last",), 10))(sim, run_dir)
    sim.run()
    with np.load(run_dir / "observations" / "secagg" / f"round_{nb.ROUNDS:04d}.npz") as z:
        tr = {k: z[k] for k in z.files}
    got = unmask(tr, int(sim.seed))
    counts = np.bincount((got.ravel() >> (BITS - 3)), minlength=8)
    centred = np.where(got >= 1 << (BITS - 1), got - (1 << BITS), got)
    return float(stats.chisquare(counts).pvalue), int(np.abs(centred).max())


def without_last(split: Split) -> Split:
    """``split`` without its last user (no other user's index moves)."""
    keep = np.arange(split.n_users - 1)
    indptr = split.train_indptr[: split.n_users]
    return dataclasses.replace(
        split, n_users=int(keep.shape[0]), train_indptr=indptr,
        train_items=split.train_items[: int(indptr[-1])], val_items=split.val_items[keep],
        test_items=split.test_items[keep], users=split.users[keep],
        source_users=split.source_users[keep])


def replaying(sim: Simulation, record: dict[int, torch.Tensor],
              replay: dict[int, torch.Tensor] | None, gaps: list[float], clip: float) -> None:
    """Record ``sim``'s released aggregates, or (``replay`` given) measure each against the
    other world's in units of C and hand the simulation the other world's instead."""
    release = sim.privacy.release_aggregate

    def wrapped(base: torch.Tensor) -> torch.Tensor:
        out = release(base)
        t = sim.privacy.round
        if replay is None:
            record[t] = out.detach().clone()
            return out
        gap = (out.double() - replay[t].double()).flatten()
        gaps.append(float(gap.norm()) * sim.privacy.expected_count / clip)
        return replay[t].to(out.dtype)

    sim.privacy.release_aggregate = wrapped  # type: ignore[method-assign]


def removal() -> list[float]:
    data = generate(SyntheticConfig(n_users=200, n_items=80, n_clusters=4, mean_activity=10,
                                    activity_sigma=0.3), seed=3)
    split = leave_one_out(data, 3)
    cfg = nb.make_config("dp-ftrl", settings={"clip": 1.0, "epsilon": 4.0,
                                              "sample_rate": 0.25})
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, rounds=4,
                                                               eval_every=4))
    saved = privacy_layer.PrivacyLayer.expected_count
    # q N with N = 200 in both worlds (the code before issue 77 had no --public-population)
    privacy_layer.PrivacyLayer.expected_count = property(  # type: ignore[assignment]
        lambda self: self.params.sample_rate * 200)
    seen: dict[int, torch.Tensor] = {}
    gaps: list[float] = []
    try:
        world_b = Simulation(cfg, without_last(split))
        replaying(world_b, seen, None, gaps, cfg.privacy.clip)
        world_b.run()
        world_a = Simulation(cfg, split)
        replaying(world_a, {}, seen, gaps, cfg.privacy.clip)
        world_a.run()
    finally:
        privacy_layer.PrivacyLayer.expected_count = saved  # type: ignore[assignment]
    return gaps


def main() -> None:
    import fedem_private

    print(f"tree: {Path(fedem_private.__file__).parent.parent}")
    p, top = unmasking()
    print(f"unmasking with the run seed: chi-square p = {p:.3g}, largest centred value "
          f"{top} of +-{1 << (BITS - 1)}")
    gaps = removal()
    print("dp-ftrl removal of the last of 200 users, gap per round / C: "
          + ", ".join(f"{g:.4f}" for g in gaps))


if __name__ == "__main__":
    main()
