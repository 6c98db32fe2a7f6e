"""Our ``imia`` against the published IMIA code, on the same recorded uploads (issue 44, item 4).

    python -m benchmarks.imia_peer --peer-dir DIR [--seeds 0] [--methods fedmf,fedncf]
                                   [--runs runs/imia-peer] [--rounds 50] [--clients 100]
                                   [--lambdas 0.9,0.1] [--jobs 1] [--out FILE]

``DIR`` is a checkout of https://github.com/hi-weiyuan/FedRec_IMIA (Yuan et al., WWW
2023) that you provide; this repository holds none of its code. Without a usable
``--peer-dir`` the script prints one line saying what it needs and exits 2.

1. The runs: ``fedem-private run --dataset ml-100k --method M --protocol strict
   --rounds R --eval-every R --seed S --record-rounds 1,R --record-clients 100`` (no
   privacy) into ``RUNS/M-sS``, then ``fedem-private attack RUNS/M-sS --attacks
   imia,support`` (attack seed 0). A run directory that already holds ``summary.json``
   (and ``attacks.json`` with both attacks) is reused after its settings are checked.
2. The glue, per recorded round and participating recorded client u: the published
   attack's own inputs, built as its ``run.py`` would have saved them. ``user_pos_neg[u]``
   = [negatives, positives] with the positives of that round and the negatives sampled
   that round (distinct, minus the positives); ``client_items[u]`` = the same items (the
   rows its client reports it trained, ``update.py``'s ``all_local_items``). The global
   model: its ``model.MLP`` for FedNCF (``layers`` [32, 32, 16, 8]: our 32-32-16-8-1 MLP,
   ReLU between, is its fc layers plus ``affine_output``) with the sent item table and
   the sent MLP; for FedMF, whose published code has no MF model, a module of the same
   interface supplied here (:class:`PeerMF`, sigmoid(p . q), as our FedMF; PFedRec's and
   FedRAP's likewise, :class:`PeerPFedRec`, :class:`PeerFedRAP`, their private head and
   personal table drawn as a client draws them; GPFedRec's is ``model.MLP`` with its
   private MLP as drawn, not the sent one). The client
   model: the same class with ``embedding_item`` = u's upload. Its ``Arguments`` get our
   run's public recipe (lr, local epochs, batch size, d, negatives, model type) and its
   ``Config`` its ``lam`` (0.9, its default, and 0.1). Its ``IMIA(config)`` then runs
   unchanged, in a subprocess whose shim makes ``.cuda()`` a no-op, sets the device to
   ``cpu``, loads its saved models with ``torch.load(weights_only=False)`` and seeds
   ``random`` / ``numpy`` / ``torch`` with 42 (its ``__main__``'s seed). One speed shim:
   its ``update.DatasetSplit.__getitem__`` indexes the whole dataset with the index list
   for every single item (O(n) per item, O(n^2) an epoch); the shim returns the same
   item, ``dataset[idxs[item]]``, so batches, their order and every random draw are the
   same (checked: the confirmed lists of three ML-100K clients are identical; 65x
   faster). ``--exact-loader`` keeps the original.
   Differences that are the published code's own and are kept: its shadow
   (``train_model``) never calls ``zero_grad`` (gradients add up over the steps), trains
   every parameter (the MLP too) from the sent model, and draws the user vector with
   ``xavier_normal_``; it is handed the candidate set (``user_pos_neg``, from ground
   truth) and confirms int(0.2 n) of them. Ours gets no ground truth: it ranks every item
   from the upload alone, and only the same labelled set is scored.
   ``--limit N`` runs both attacks on the N lowest client ids only (ours rerun on that
   slice of the observation with the shadow ``fedem-private attack`` builds; the table
   then adds ours on every recorded client, from ``attacks.json``).
3. Scores. The published attack outputs a set (``confirmed_pos``, int(0.2 |candidates|)
   items) and ranks nothing. A wrapper of its ``train_model`` keeps references to the
   lists its loop fills, so the order in which it confirms items is read without changing
   it. Ranking derived from that order: confirmed positives first (earliest first), then
   the items never confirmed (tied), then confirmed negatives (earliest last). Both
   attacks are scored by ``attacks.scoring`` under ``positive_vs_sampled``: each client's
   labelled set is its positives (1) and that round's sampled negatives (0), every other
   item left out; F1@20% = the top ceil(0.2 |labelled|) items (ties in a seeded random
   order), per-client AUC = the mean over clients of the Mann-Whitney AUC. The published
   attack's own F1 (its set, its int cutoff, as it prints) is given too. Ours is read
   from ``attacks.json`` (``relations.positive_vs_sampled``: ``f1@20%``,
   ``auc_client_mean``); ``imia`` and ``support`` rank every item but only the labelled
   set is scored. Random: ``f1@20%_random_baseline``, AUC 0.5.

Prints one Markdown table (per backbone, round and seed, then the mean ± sd over seeds)
and writes a JSON with every figure (default ``benchmarks/results/attacks/imia_peer.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

PEER_REPO = "hi-weiyuan/FedRec_IMIA"
NEEDS = (f"benchmarks.imia_peer needs a checkout of {PEER_REPO}: pass --peer-dir DIR "
         f"(git clone https://github.com/{PEER_REPO} DIR)")
PEER_FILES = ("membership_attack.py", "model.py", "run.py", "data.py", "update.py",
              "utils.py", "engine.py", "metrics.py")
BACKBONES = {"fedmf": "mf", "fedncf": "ncf", "pfedrec": "pfedrec", "gpfedrec": "gpfedrec",
             "fedrap": "fedrap"}
NCF_LIKE = ("ncf", "gpfedrec")  # the published ``model.MLP`` is their client model
RELATION = "positive_vs_sampled"
CUTOFF = 0.2  # the published select_ratio, and attacks.scoring.PUBLISHED_CUTOFF
PEER_SEED = 42  # membership_attack.py's __main__: random.seed(42)
ROOT = Path(__file__).resolve().parents[1]


def peer_problem(peer_dir: str | None) -> str | None:
    """Why ``peer_dir`` cannot be run (None when it can)."""
    from benchmarks.common import checkout_problem  # lazily: the peer's child imports us bare

    return checkout_problem(peer_dir, NEEDS, PEER_FILES)


# ------------------------------------------------------------------ glue (no peer code)
def candidate_sets(positives: list[np.ndarray], negatives: list[np.ndarray]
                   ) -> list[tuple[list[int], list[int]]]:
    """Per client (positives, negatives) as the published ``user_pos_neg`` holds them:
    distinct positives, and the distinct sampled negatives that are not positives
    (the labelled set of ``positive_vs_sampled``), both sorted."""
    out = []
    for pos, neg in zip(positives, negatives, strict=True):
        p = sorted({int(i) for i in pos})
        n = sorted({int(i) for i in neg} - set(p))
        out.append((p, n))
    return out


def order_scores(n_items: int, confirmed_pos: list[int], confirmed_neg: list[int],
                 candidates: list[int]) -> np.ndarray:
    """(n_items,) scores from the order the published loop confirmed items: confirmed
    positives first (earliest highest), never-confirmed candidates 0, confirmed negatives
    last (earliest lowest); items outside ``candidates`` NaN."""
    s = np.full(n_items, np.nan)
    big = 2 * max(len(candidates), 1)
    s[list(candidates)] = 0.0
    for i, item in enumerate(confirmed_pos):
        s[item] = big - i
    for j, item in enumerate(confirmed_neg):
        s[item] = -(big - j)
    return s


def labels_matrix(sets: list[tuple[list[int], list[int]]], n_items: int) -> np.ndarray:
    """(k, n_items) labels: 1 positive, 0 sampled negative, NaN not scored."""
    y = np.full((len(sets), n_items), np.nan)
    for j, (pos, neg) in enumerate(sets):
        y[j, neg] = 0.0
        y[j, pos] = 1.0
    return y


def f1_at_cutoff(scores: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict[str, float]:
    """F1 (and its random baseline) at the published cutoff, by ``attacks.scoring``."""
    from attacks.scoring import cutoff_metrics

    return cutoff_metrics(scores, labels, CUTOFF, seed)


def client_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean per-client AUC over clients with both classes (``auc_client_mean``)."""
    from attacks.scoring import auc_rank

    out = []
    for s, y in zip(scores, labels, strict=True):
        m = ~np.isnan(y)
        a = auc_rank(y[m].astype(np.int64), s[m])
        if not math.isnan(a):
            out.append(a)
    return float(np.mean(out)) if out else math.nan


def _participants(obs: Any, limit: int | None) -> np.ndarray:
    """Rows of the participating recorded clients, by client id; the ``limit`` lowest ids."""
    keep = np.flatnonzero(obs.participated)
    keep = keep[np.argsort(obs.clients[keep], kind="stable")]
    return keep if limit is None else keep[:limit]


def _init_std(run_dir: Path) -> float | None:
    """The run's public ``train.init_std`` (FedRAP's personal tables are drawn with it);
    None without a config.toml."""
    from fedem_private.experiments.analysis import read_toml

    path = run_dir / "config.toml"
    if not path.is_file():
        return None
    return float(read_toml(path, "run config").get("train", {}).get("init_std", 0.1))


def peer_job(run_dir: Path, round_: int, limit: int | None = None) -> dict[str, Any]:
    """The published attack's inputs for one recorded round, as plain arrays: the sent
    tables, each participating client's upload and candidate sets, the public recipe."""
    from attacks.ground_truth import load_ground_truth
    from attacks.observations import load_observations, load_public

    public = load_public(run_dir)
    obs = load_observations(run_dir, [round_])[0]
    gt = load_ground_truth(run_dir, [round_])[0].select(obs.clients)
    keep = _participants(obs, limit)
    sets = candidate_sets([gt.positives.row(int(j)) for j in keep],
                          [gt.negatives.row(int(j)) for j in keep])
    if not np.allclose(obs.sent[keep], obs.sent[keep[0]]):
        raise ValueError(f"{run_dir} round {round_}: clients were sent different tables")
    dense = {name: np.asarray(a[keep[0]]) for name, a in obs.sent_dense.items()}
    return {"backbone": public.backbone, "n_users": int(public.n_clients),
            "n_items": int(public.n_items), "dim": int(public.dim), "lr": float(public.lr),
            "local_epochs": int(public.local_epochs), "batch_size": int(public.batch_size),
            "num_negatives": int(public.num_negatives), "optimizer": public.optimizer,
            "init_std": _init_std(run_dir),
            "sent": np.asarray(obs.sent[keep[0]], dtype=np.float32), "sent_dense": dense,
            "clients": [int(c) for c in obs.clients[keep]],
            "uploads": np.asarray(obs.upload[keep], dtype=np.float32), "sets": sets}


# ------------------------------------------------------------------ the child (peer code)
class PeerMF(torch.nn.Module):
    """FedMF's client model with the published models' interface (``embedding_user``,
    ``embedding_item``, ``forward(users, items)`` -> probability): the published code
    has NCF (``MLP``) and LightGCN only. sigmoid(p_u . q_i), as our FedMF."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embedding_user = torch.nn.Embedding(config.num_users, config.latent_dim)
        self.embedding_item = torch.nn.Embedding(config.num_items, config.latent_dim)

    def forward(self, user_indices, item_indices):
        u, i = self.embedding_user(user_indices), self.embedding_item(item_indices)
        return torch.sigmoid((u * i).sum(-1))


class PeerPFedRec(torch.nn.Module):
    """PFedRec's client model with the same interface: sigmoid(w_u . q_i + b_u). The head
    nn.Linear(d, 1) is private, so it is drawn at nn.Linear's init (as a PFedRec client
    draws it at the start); ``embedding_user`` is there for the published attack's user
    re-draw and is not used."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embedding_user = torch.nn.Embedding(config.num_users, config.latent_dim)
        self.embedding_item = torch.nn.Embedding(config.num_items, config.latent_dim)
        self.affine_output = torch.nn.Linear(config.latent_dim, 1)

    def forward(self, user_indices, item_indices):
        return torch.sigmoid(self.affine_output(self.embedding_item(item_indices)).squeeze(-1))


class PeerFedRAP(PeerPFedRec):
    """FedRAP's client model with the same interface: sigmoid(w_u . (c_i + p_ui) + b_u),
    ``embedding_item`` the shared C; the personal table (drawn N(0, init_std^2), as a
    FedRAP client draws it) and the head are private. The published loss is BCE alone
    (FedRAP's two regularisers are not in it)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.personal = torch.nn.Embedding(config.num_items, config.latent_dim)
        torch.nn.init.normal_(self.personal.weight, std=config.fedrap_init_std)

    def forward(self, user_indices, item_indices):
        item = self.embedding_item(item_indices) + self.personal(item_indices)
        return torch.sigmoid(self.affine_output(item).squeeze(-1))


PEER_MODULES = {"mf": PeerMF, "pfedrec": PeerPFedRec, "fedrap": PeerFedRAP}


def _peer_models(job: dict[str, Any], peer_model: Any, args: Any) -> tuple[Any, dict, dict]:
    def build(items: np.ndarray):
        ncf = job["backbone"] in NCF_LIKE
        m = peer_model.MLP(args) if ncf else PEER_MODULES[job["backbone"]](args)
        with torch.no_grad():
            m.embedding_item.weight.copy_(torch.from_numpy(np.asarray(items)))
            if job["backbone"] == "ncf":  # GPFedRec's MLP is private: kept as drawn
                d = job["sent_dense"]
                linears = [*m.fc_layers, m.affine_output]
                if len(linears) * 2 != len(d):
                    raise ValueError(f"MLP shapes differ: {len(linears)} layers, {sorted(d)}")
                for j, lin in enumerate(linears):
                    lin.weight.copy_(torch.from_numpy(d[f"w{j}"]).T)
                    lin.bias.copy_(torch.from_numpy(d[f"b{j}"]))
        return m

    g = build(job["sent"])
    clients = {u: build(job["uploads"][j]) for j, u in enumerate(job["clients"])}
    items = {u: pos + neg for u, (pos, neg) in zip(job["clients"], job["sets"], strict=True)}
    return g, clients, items


def run_peer_child(peer_dir: str, job_path: str, lam: float, out_path: str,
                   fast_loader: bool = True) -> None:
    """Run the published ``IMIA(config)`` unchanged on one recorded round (module docstring)."""
    import random

    from .common import cuda_calls_on_cpu

    torch.set_num_threads(1)
    cuda_calls_on_cpu()
    original_load = torch.load
    torch.load = lambda *a, **k: original_load(*a, **{"weights_only": False, **k})
    job = pickle.loads(Path(job_path).read_bytes())
    work = Path(tempfile.mkdtemp(prefix="imia_peer_"))
    os.chdir(work)
    sys.path.insert(0, str(Path(peer_dir).resolve()))
    import run as peer_run  # the published modules, from peer_dir
    import update as peer_update

    if fast_loader:  # same items, same order, same random draws; O(1) instead of O(n) each
        peer_update.DatasetSplit.__getitem__ = lambda self, item: self.dataset[self.idxs[item]]

    original_init = peer_run.Arguments.__init__

    def our_arguments(self):  # its defaults, then our run's public recipe
        original_init(self)
        self.use_cuda, self.device_id = False, "cpu"
        self.num_users, self.num_items = job["n_users"], job["n_items"]
        self.latent_dim, self.num_negative = job["dim"], job["num_negatives"]
        self.lr, self.local_epoch, self.local_bs = job["lr"], job["local_epochs"], job["batch_size"]
        self.optimizer = job["optimizer"]
        self.model_type = "NCF" if job["backbone"] in NCF_LIKE else "MF"
        self.fedrap_init_std = job["init_std"]
        self.layers = [2 * job["dim"], 32, 16, 8]  # our FedNCF's MLP, layers.py LAYERS

    peer_run.Arguments.__init__ = our_arguments
    args = peer_run.Arguments()
    data = Path(args.random_data_save_path.format(str(args.num_negative)))
    data.parent.mkdir(parents=True, exist_ok=True)
    user_pos_neg = {u: [list(neg), list(pos)] for u, (pos, neg) in
                    zip(job["clients"], job["sets"], strict=True)}
    data.write_bytes(pickle.dumps({"user_pos_neg": user_pos_neg}))
    import membership_attack as ma
    import model as peer_model

    torch.manual_seed(PEER_SEED)  # the private parts' draws (reseeded before the attack)
    g, clients, items = _peer_models(job, peer_model, args)
    saved = work / "fed.model"
    torch.save({"all_global_models": [g], "all_client_models": [clients],
                "all_client_items": [items]}, saved)
    config = ma.Config()
    config.model_path, config.lam, config.device_type = str(saved), lam, "cpu"

    lists: dict[str, Any] = {}
    original_train = ma.train_model

    def train_model(*a, **k):  # keep the caller's confirmed lists (appended to, never rebound)
        caller = sys._getframe(1).f_locals
        lists["pos"], lists["neg"] = caller["confirmed_pos"], caller["confirmed_neg"]
        return original_train(*a, **k)

    original_one = ma.IMIA_for_one_user
    results: dict[int, Any] = {}

    def one_user(config, user_id, *a, **k):
        t0 = time.perf_counter()
        p, r, f = original_one(config, user_id, *a, **k)
        results[int(user_id)] = {"confirmed_pos": [int(i) for i in lists["pos"]],
                                 "confirmed_neg": [int(i) for i in lists["neg"]],
                                 "p": p, "r": r, "f": f,
                                 "seconds": time.perf_counter() - t0}
        return p, r, f

    ma.train_model, ma.IMIA_for_one_user = train_model, one_user
    random.seed(PEER_SEED)
    np.random.seed(PEER_SEED)
    torch.manual_seed(PEER_SEED)
    t0 = time.perf_counter()
    ma.IMIA(config)
    Path(out_path).write_text(json.dumps({"lam": lam, "seconds": time.perf_counter() - t0,
                                          "users": results}))


# ------------------------------------------------------------------ the parent
def _cli(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run([sys.executable, "-m", "fedem_private", *args], check=True, env=env)


def ensure_run(runs: Path, method: str, seed: int, rounds: int, clients: int,
               data_dir: str) -> Path:
    """Record (or reuse, after checking its settings) the run; attack it with imia, support."""
    path = runs / f"{method}-s{seed}"
    if not (path / "summary.json").exists():
        _cli("run", "--dataset", "ml-100k", "--data-dir", data_dir, "--method", method,
             "--protocol", "strict", "--rounds", str(rounds), "--eval-every", str(rounds),
             "--seed", str(seed), "--record-rounds", f"1,{rounds}",
             "--record-clients", str(clients), "--out", str(path), "--no-progress", "--force")
    summary = json.loads((path / "summary.json").read_text())
    public = json.loads((path / "observations" / "public.json").read_text())
    want = {"method": method, "seed": seed, "rounds": rounds, "protocol": "strict"}
    got = {k: summary.get(k) for k in want}
    extra = public.get("extra", {})
    if (got != want or public.get("privacy_mode") != "none"
            or extra.get("recorded_clients") != clients
            or extra.get("recorded_rounds") != [1, rounds]):
        raise ValueError(f"{path} is not the run asked for: {got}, privacy "
                         f"{public.get('privacy_mode')}, recorded {extra.get('recorded_rounds')} "
                         f"x {extra.get('recorded_clients')} clients")
    report = path / "attacks.json"
    done = json.loads(report.read_text()) if report.exists() else {}
    if not {"imia", "support"} <= {r["attack"] for r in done.get("records", [])}:
        _cli("attack", str(path), "--attacks", "imia,support", "--seed", "0", "--quiet")
    return path


def ours(path: Path, round_: int) -> dict[str, dict[str, float]]:
    report = json.loads((path / "attacks.json").read_text())
    out = {}
    for r in report["records"]:
        if r["round"] == round_ and r["attack"] in ("imia", "support"):
            m = r["relations"][RELATION]
            out[r["attack"]] = {"f1": m["f1@20%"], "auc": m["auc_client_mean"]}
            out["random"] = {"f1": m["f1@20%_random_baseline"], "auc": 0.5}
    return out


def ours_subset(path: Path, round_: int, limit: int) -> dict[str, dict[str, float]]:
    """Ours on the first ``limit`` participating recorded clients only: ``imia`` (with the
    shadow ``fedem-private attack`` builds) and ``support`` rerun on that slice of the
    observation, scored like the published attack (same labels, same functions)."""
    from attacks import ATTACKS
    from attacks.ground_truth import load_ground_truth
    from attacks.observations import Observation, load_observations, load_public
    from fedem_private.experiments.shadow import shadow_model

    public = load_public(path)
    obs = load_observations(path, [round_])[0]
    keep = _participants(obs, limit)
    sub = Observation(obs.round, obs.clients[keep], obs.sent[keep], obs.upload[keep],
                      obs.participated[keep], {n: a[keep] for n, a in obs.sent_dense.items()})
    gt = load_ground_truth(path, [round_])[0].select(sub.clients)
    sets = candidate_sets(list(gt.positives.rows()), list(gt.negatives.rows()))
    labels = labels_matrix(sets, sub.n_items)
    out = {}
    for name, options in (("imia", {"shadow": shadow_model(public)}), ("support", {})):
        t0 = time.perf_counter()
        scores = ATTACKS[name](sub, public, **options)
        cut = f1_at_cutoff(scores, labels)
        out[name] = {"f1": cut["f1"], "auc": client_auc(scores, labels),
                     "seconds": time.perf_counter() - t0}
        out["random"] = {"f1": cut["random_baseline"], "auc": 0.5}
    return out


def score_peer(job: dict[str, Any], result: dict[str, Any]) -> dict[str, float]:
    n = job["n_items"]
    rows, sets, own = [], [], []
    for u, (pos, neg) in zip(job["clients"], job["sets"], strict=True):
        r = result["users"][str(u)]
        rows.append(order_scores(n, r["confirmed_pos"], r["confirmed_neg"], pos + neg))
        sets.append((pos, neg))
        own.append(r["f"])
    scores, labels = np.vstack(rows), labels_matrix(sets, n)
    return {"f1": f1_at_cutoff(scores, labels)["f1"], "auc": client_auc(scores, labels),
            "f1_own": float(np.mean(own)), "seconds": result["seconds"]}


def run_peer(peer_dir: str, job: dict[str, Any], lam: float, logs: Path, tag: str,
             exact_loader: bool = False) -> dict[str, Any]:
    job_path = logs / f"{tag}.job.pkl"
    job_path.write_bytes(pickle.dumps(job))
    out = logs / f"{tag}.lam{lam:g}.json"
    log = logs / f"{tag}.lam{lam:g}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as err:
        extra = ["--exact-loader"] if exact_loader else []
        rc = subprocess.run([sys.executable, "-m", "benchmarks.imia_peer", "--child", *extra,
                             "--peer-dir", peer_dir, "--job", str(job_path), "--lam", str(lam),
                             "--child-out", str(out)], stdout=err, stderr=err, env=env,
                            cwd=str(ROOT)).returncode
    if rc != 0:
        raise RuntimeError(f"the published IMIA exited {rc} ({tag}, lambda {lam}); "
                           f"the end of {log}:\n{log.read_text()[-3000:]}")
    return score_peer(job, json.loads(out.read_text()))


def _cell(m: dict[str, float] | None, own: bool = False) -> str:
    if not m:
        return "-"
    text = f"{m['f1']:.3f} / {m['auc']:.3f}"
    return text + (f" ({m['f1_own']:.3f})" if own and "f1_own" in m else "")


def table(rows: list[dict[str, Any]], lambdas: list[float]) -> str:
    cols = ["ours `imia`", *(f"published, lambda {lam:g}" for lam in lambdas), "`support`",
            "random"]
    out = ["| backbone | round | seed | " + " | ".join(cols) + " |",
           "|---" * (3 + len(cols)) + "|"]
    keys = ["imia", *(f"peer{lam:g}" for lam in lambdas), "support", "random"]
    if any((r.get("all_clients") or {}).get("imia") != r.get("imia") for r in rows):  # --limit
        cols.append("ours `imia`, every recorded client (attacks.json)")
        out = ["| backbone | round | seed | " + " | ".join(cols) + " |",
               "|---" * (3 + len(cols)) + "|"]
        for r in rows:
            r["imia_all"] = (r.get("all_clients") or {}).get("imia")
        keys.append("imia_all")

    def line(r: dict[str, Any], seed: str) -> str:
        return (f"| {r['method']} | {r['round']} | {seed} | "
                + " | ".join(_cell(r.get(k), own=k.startswith("peer")) for k in keys) + " |")

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        out.append(line(r, str(r["seed"])))
        groups.setdefault((r["method"], r["round"]), []).append(r)
    for (method, round_), rs in groups.items():
        if len(rs) < 2:
            continue
        cells = []
        for k in keys:
            vals = [r[k] for r in rs if r.get(k)]
            if len(vals) != len(rs):
                cells.append("-")
                continue
            f1, auc = (np.array([v[x] for v in vals]) for x in ("f1", "auc"))
            cells.append(f"{f1.mean():.3f} ± {f1.std(ddof=1):.3f} / "
                         f"{auc.mean():.3f} ± {auc.std(ddof=1):.3f}")
        out.append(f"| {method} | {round_} | mean ± sd of {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.imia_peer",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-dir", help=f"a checkout of {PEER_REPO}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    ap.add_argument("--methods", default="fedmf,fedncf")
    ap.add_argument("--runs", default="runs/imia-peer", help="run directories (METHOD-sSEED)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--clients", type=int, default=100, help="recorded clients 0..N-1")
    ap.add_argument("--limit", type=int, help="attack only the N lowest ids among the "
                    "participating recorded clients (both attacks rerun on them; default: all)")
    ap.add_argument("--lambdas", default="0.9,0.1", help="the published attack's lam values")
    ap.add_argument("--jobs", type=int, default=1, help="published-attack subprocesses at once")
    ap.add_argument("--data-dir", help="the ML-100K folder (default: the shared datasets folder)")
    ap.add_argument("--out", default="benchmarks/results/attacks/imia_peer.json")
    ap.add_argument("--exact-loader", action="store_true",
                    help="keep the published DatasetSplit.__getitem__ (O(n) per item)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--lam", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--table-from", nargs="+", metavar="JSON",
                    help="print the table of earlier runs' JSON files (rows merged) and exit")
    args = ap.parse_args(argv)
    lambdas = [float(x) for x in args.lambdas.split(",") if x]
    if args.table_from:
        rows = [r for f in args.table_from for r in json.loads(Path(f).read_text())["rows"]]
        rows.sort(key=lambda r: (r["method"], r["round"], r["seed"]))
        print(table(rows, lambdas))
        return 0
    problem = peer_problem(args.peer_dir)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    peer_dir = str(Path(args.peer_dir).resolve())
    if args.child:
        run_peer_child(peer_dir, args.job, args.lam, args.child_out, not args.exact_loader)
        return 0
    methods = [m for m in args.methods.split(",") if m]
    if bad := [m for m in methods if m not in BACKBONES]:
        print(f"benchmarks.imia_peer: --methods takes {', '.join(BACKBONES)}, not {bad}",
              file=sys.stderr)
        return 2
    from .common import data_dir, machine

    ml100k = args.data_dir or data_dir("ml-100k")
    logs = Path(tempfile.mkdtemp(prefix="imia_peer_logs_"))
    command = " ".join(["python -m benchmarks.imia_peer",
                        *(argv if argv is not None else sys.argv[1:])])
    print(f"{command}\npublished attack's logs in {logs}", flush=True)
    rows, tasks = [], []
    for method in methods:
        for seed in args.seeds:
            path = ensure_run(Path(args.runs), method, seed, args.rounds, args.clients, ml100k)
            for round_ in (1, args.rounds):
                job = peer_job(path, round_, args.limit)
                rows.append({"method": method, "round": round_, "seed": seed, "run": str(path),
                             "clients": len(job["clients"]), "limited": args.limit is not None,
                             "all_clients": ours(path, round_)})
                tag = f"{method}-s{seed}-r{round_}"
                tasks += [(rows[-1], lam, job, tag) for lam in lambdas]

    tasks.sort(key=lambda t: (t[1], t[2]["backbone"] != "ncf"))  # the longest first

    def one(task: tuple[dict[str, Any], float, dict[str, Any], str]) -> None:
        row, lam, job, tag = task
        row[f"peer{lam:g}"] = run_peer(peer_dir, job, lam, logs, tag, args.exact_loader)
        print(f"{tag} lambda {lam:g}: {_cell(row[f'peer{lam:g}'], own=True)} in "
              f"{row[f'peer{lam:g}']['seconds']:.0f} s", flush=True)

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(one, t) for t in tasks]  # the published attack starts at once
        for row in rows:  # ours meanwhile, in this process
            row.update(row["all_clients"] if args.limit is None
                       else ours_subset(Path(row["run"]), row["round"], args.limit))
            print(f"{row['method']}-s{row['seed']}-r{row['round']} ours: "
                  f"imia {_cell(row['imia'])}, support {_cell(row['support'])}", flush=True)
        for f in futures:
            f.result()
    text = table(rows, lambdas)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "imia_peer", "command": command,
                               "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                               "machine": machine(), "relation": RELATION, "rows": rows},
                              indent=1, default=str))
    print("\nF1@20% / per-client AUC under positive_vs_sampled (the published attack's own "
          "F1, its int(0.2 n) set, in brackets)\n")
    print(text)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
