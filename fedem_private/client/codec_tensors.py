"""Upload codecs' tensor code: what a client's shared groups look like on the wire, and back.

The codecs are registered classes (:mod:`fedem_private.client.codec_kinds`, light: what
each is and can do); each builds one of the objects here. :mod:`fedem_private.client.codecs`
builds one by name and re-exports this module's names. Nothing here imports the
registry or the classes back (docs/design.md section 1: no import circles).

A codec (docs/design.md section 9, and section 11 for FedPEFT's) turns a chunk's
shared groups (item table (k, m, d) and dense groups such as an MLP) into one
upload tensor (k, rows, d), and the server decodes an upload into the
item-table and dense groups it implies. The privacy mechanism clips and
noises the encoded upload as a whole, so every value that leaves the client
is covered; aggregation and the attacks see the decoded item table.

``full``: the item table itself, with the dense groups flattened and
zero-padded into extra rows of width d below it. With no dense groups the
upload *is* the item table (no copy).

FedPEFT's codecs (docs/design.md section 11; FedPEFT paper, equations 1, 2, 5-6 and
11) train and upload a small set of parameters theta instead of the table.
After W warm-up rounds of ``full`` training the server's global table becomes
the frozen base E0, and every item vector is E0[i] + f_theta(i):

- ``lora``: theta = (A (m, k_L), B (d, k_L)), f(i) = B a_i; A ~ N(0, s^2), B = 0
  at the start (equations 1-2);
- ``hash``: theta = H (d_H, d), f(i) = mean_j H[h_j(i)] over h universal hash
  functions h_j(i) = ((a_j i + b_j) mod p) mod d_H chosen by the server
  (equations 3-5, mean pooling); with ``hash_senet`` r > 0, f(i) = sum_j w_ij
  H[h_j(i)] with weights from a squeeze-and-excitation net, w_i = sigmoid(W2
  relu(W1 s_i)), s_ij the mean of H[h_j(i)]'s entries, W1 (r h, h) and W2
  (h, r h) trained and uploaded with H (equations 6-9);
- ``rqvae``: theta = codebooks C_0..C_{l-1} (d_R, d each), f(i) =
  sum_j C_j[c_ij], the codes c_i fixed on the server by residual k-means
  of E0 (equation 11; k-means stands in for a trained RQ-VAE).

The ``c-`` variants drop E0 from the item vector (compressed only; the
warm-up table is then used only to derive the codes). See
:class:`PeftCodec` for how a client trains theta and what the server decodes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedem_private.client.codec_options import PeftConfig
from fedem_private.models.base import ItemRows, LocalTrainConfig, Plan, adam_buffers, fused_adam


class FullCodec:
    """The whole item table (and dense groups as extra rows) is uploaded."""

    name = "full"
    peft = False

    def __init__(self, n_items: int, dim: int, dense_shapes: dict[str, tuple[int, ...]]) -> None:
        self.m, self.d = n_items, dim
        self.shapes = dict(dense_shapes)
        self.sizes = {n: math.prod(s) for n, s in self.shapes.items()}
        total = sum(self.sizes.values())
        self.extra_rows = -(-total // dim) if total else 0

    @property
    def rows(self) -> int:
        """Rows of width d in one upload."""
        return self.m + self.extra_rows

    def upload_bytes(self, itemsize: int = 4) -> int:
        """Bytes one client sends per round (item table plus dense groups, unpadded)."""
        return itemsize * (self.m * self.d + sum(self.sizes.values()))

    def encode(self, items: Tensor, dense: dict[str, Tensor]) -> Tensor:
        """(k, m, d) and dense groups (k, ...) -> one upload (k, rows, d)."""
        if not self.shapes:
            return items
        k = items.shape[0]
        flat = torch.cat([dense[n].reshape(k, -1) for n in self.shapes], dim=1)
        pad = self.extra_rows * self.d - flat.shape[1]
        flat = torch.nn.functional.pad(flat, (0, pad))
        return torch.cat([items, flat.view(k, self.extra_rows, self.d)], dim=1)

    def decode(self, upload: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """One upload (k, rows, d) -> (item table (k, m, d), dense groups (k, ...))."""
        if not self.shapes:
            return upload, {}
        k = upload.shape[0]
        items = upload[:, : self.m]
        flat = upload[:, self.m:].reshape(k, -1)
        out, a = {}, 0
        for n, shape in self.shapes.items():
            out[n] = flat[:, a: a + self.sizes[n]].reshape(k, *shape)
            a += self.sizes[n]
        return items, out

    def touched(self, touched_items: Tensor) -> Tensor:
        """Which upload rows a client trained on: its touched items, and every dense row."""
        if not self.extra_rows:
            return touched_items
        k = touched_items.shape[0]
        ones = torch.ones((k, self.extra_rows), dtype=torch.bool, device=touched_items.device)
        return torch.cat([touched_items, ones], dim=1)


#: the prime p of the universal hash family (2^31 - 1); a_j i + b_j stays below 2^62
HASH_PRIME = 2_147_483_647


class PeftCodec:
    """A FedPEFT codec: frozen base E0, trainable parameters theta, item i = E0[i] + f_theta(i).

    Life cycle. :meth:`prepare` (called by the round loop once, after the
    warm-up, with the server's global table) fixes E0, the codes or hash
    functions, and returns the initial theta (no client axis). In each later
    round a client is sent theta; it starts from a frozen base table ``base``
    (E0 under static replacement; under a merge, the merged table minus
    f_theta_sent, so that the starting item vectors ARE the merged table and
    the merge's offset is the client's own, never uploaded) and trains theta
    alone through :class:`PeftRows` (the backbone never knows). The upload is
    theta (and the dense groups) encoded as rows of width d; the privacy layer
    clips and noises that encoded upload, so the sensitivity is over theta:
    an L1 / L2 clip at C of the encoded delta, whatever its length. The server
    decodes each released theta to the table E0 + f_theta it implies
    (:meth:`table`): that is what the attacks and the recording see.
    """

    peft = True

    def __init__(self, name: str, n_items: int, dim: int,
                 dense_shapes: dict[str, tuple[int, ...]], cfg: PeftConfig,
                 kind: str | None = None, with_base: bool | None = None) -> None:
        """``kind``: lora, hash or rqvae; ``with_base``: whether the item vectors add E0
        (False: a ``c-`` codec). None: read from ``name`` (``c-`` prefix and kind)."""
        self.name, self.m, self.d, self.cfg = name, n_items, dim, cfg
        self.with_base = not name.startswith("c-") if with_base is None else with_base
        self.kind = name.removeprefix("c-") if kind is None else kind
        self.dense_shapes = dict(dense_shapes)
        if self.kind == "lora":
            self.shapes = {"A": (n_items, cfg.lora_rank), "B": (dim, cfg.lora_rank)}
        elif self.kind == "hash":
            self.shapes = {"H": (cfg.hash_size, dim)}
            if cfg.hash_senet > 0:  # the SENet's two matrices, trained and aggregated too
                h, h1 = cfg.hash_functions, cfg.hash_senet * cfg.hash_functions
                self.shapes.update({"W1": (h1, h), "W2": (h, h1)})
        elif self.kind == "rqvae":
            self.shapes = {"C": (cfg.rq_levels * cfg.rq_codebook, dim)}
        else:
            raise ValueError(f"unknown codec {name!r}")
        self.all_shapes = {**self.shapes, **self.dense_shapes}
        self.sizes = {n: math.prod(s) for n, s in self.all_shapes.items()}
        self.rows = -(-sum(self.sizes.values()) // dim)
        self.senet = self.kind == "hash" and cfg.hash_senet > 0
        self.e0: Tensor | None = None
        self.codes: Tensor | None = None  # (m, nb) bucket rows of each item (hash, rqvae)
        self.code_weights: Tensor | None = None  # (nb,) weight of each bucket row
        self.hash_ab: Tensor | None = None  # (h, 2) the hash functions' (a, b)
        self.device = torch.device("cpu")  # of E0, the codes and theta: E0's (prepare)

    # ------------------------------------------------------------ server side
    def prepare(self, e0: Tensor, seed: int, init_std: float) -> dict[str, Tensor]:
        """Fix E0 (zeros for a ``c-`` codec), the codes or hashes; the initial theta.

        Everything lives on E0's device; the hashes, the k-means codes and theta
        are drawn on the CPU (keyed as on a CPU run) and moved there.
        """
        from fedem_private import rng

        dev = self.device = e0.device
        self.e0 = (e0.detach().clone() if self.with_base
                   else torch.zeros_like(e0))
        gen = rng.generator(seed, rng.Stream.INIT, 0, (1 << 40) + 11)
        if self.kind == "hash":
            ab, codes = hash_codes(self.m, self.cfg.hash_functions, self.cfg.hash_size, gen)
            self.hash_ab, self.codes = ab.to(dev), codes.to(dev)
            self.code_weights = torch.full((self.cfg.hash_functions,),
                                           1.0 / self.cfg.hash_functions, dtype=e0.dtype,
                                           device=dev)
        elif self.kind == "rqvae":
            codes = residual_kmeans(e0.detach().double().cpu().numpy(), self.cfg.rq_levels,
                                    self.cfg.rq_codebook, seed)
            offsets = np.arange(self.cfg.rq_levels) * self.cfg.rq_codebook
            self.codes = torch.from_numpy(codes + offsets[None, :]).long().to(dev)
            self.code_weights = torch.ones(self.cfg.rq_levels, dtype=e0.dtype, device=dev)
        theta = {n: (torch.randn(s, generator=gen, dtype=e0.dtype) * init_std).to(dev)
                 for n, s in self.shapes.items()}
        if self.kind == "lora":
            theta["B"].zero_()  # B = 0 at the start (paper, section "LoRA")
        elif self.cfg.init == "zero":
            for v in theta.values():
                v.zero_()
        return theta

    def one_time_bytes(self) -> int:
        """Bytes each client downloads once, when the codec starts: E0, codes, hash (a, b)."""
        out = 0
        if self.with_base:
            assert self.e0 is not None
            out += self.e0.numel() * self.e0.element_size()
        if self.kind == "rqvae":
            out += self.m * self.cfg.rq_levels * code_itemsize(self.cfg.rq_codebook)
        if self.kind == "hash":
            out += self.cfg.hash_functions * 2 * 8
        return out

    # ----------------------------------------------------------------- decode
    def delta(self, theta: dict[str, Tensor]) -> Tensor:
        """f_theta for every item: theta with a client axis (k, ...) -> (k, m, d)."""
        if self.kind == "lora":
            return torch.bmm(theta["A"], theta["B"].transpose(1, 2))
        table = theta["H" if self.kind == "hash" else "C"]  # (k, R, d)
        assert self.codes is not None and self.code_weights is not None
        k = table.shape[0]
        if self.senet:
            nb = self.codes.shape[1]
            v = table.index_select(1, self.codes.reshape(-1)).view(k, self.m, nb, self.d)
            w = senet_weights(v.reshape(k, self.m * nb, self.d).mean(-1).view(k, self.m, nb),
                              theta["W1"], theta["W2"])
            return (w.unsqueeze(-1) * v).sum(2)
        out = torch.zeros((k, self.m, self.d), dtype=table.dtype, device=table.device)
        for j in range(self.codes.shape[1]):
            out.add_(table.index_select(1, self.codes[:, j]), alpha=float(self.code_weights[j]))
        return out

    def table(self, theta: dict[str, Tensor]) -> Tensor:
        """The item tables E0 + f_theta (k, m, d) the parameters imply (section 11)."""
        assert self.e0 is not None, "prepare() first"
        return self.delta(theta).add_(self.e0)

    # ------------------------------------------------------------------- wire
    def upload_bytes(self, itemsize: int = 4) -> int:
        """Bytes of theta and the dense groups (unpadded), per client."""
        return itemsize * sum(self.sizes.values())

    def encode(self, theta: dict[str, Tensor], dense: dict[str, Tensor]) -> Tensor:
        """theta and dense groups (k, ...) -> one upload (k, rows, d), zero-padded."""
        groups = {**theta, **dense}
        k = next(iter(groups.values())).shape[0]
        flat = torch.cat([groups[n].reshape(k, -1) for n in self.all_shapes], dim=1)
        flat = torch.nn.functional.pad(flat, (0, self.rows * self.d - flat.shape[1]))
        return flat.view(k, self.rows, self.d)

    def decode(self, upload: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """One upload (k, rows, d) -> (theta, dense groups), each (k, ...)."""
        k = upload.shape[0]
        flat = upload.reshape(k, -1)
        theta, dense, a = {}, {}, 0
        for n, shape in self.all_shapes.items():
            (theta if n in self.shapes else dense)[n] = flat[:, a: a + self.sizes[n]].reshape(
                k, *shape)
            a += self.sizes[n]
        return theta, dense

    def touched(self, k: int) -> Tensor:
        """Every upload row counts as trained: theta is dense (k, rows), on the codec's
        device."""
        return torch.ones((k, self.rows), dtype=torch.bool, device=self.device)

    # ------------------------------------------------------------------ train
    def trainer(self, theta: dict[str, Tensor], base: Tensor | None = None) -> PeftRows:
        """The :class:`~fedem_private.models.base.ItemRows` factory of one chunk, starting
        from ``theta`` (k, ...); ``base`` (m, d) the frozen table (None: the starting
        table minus f_theta, see the class docstring). Read ``.theta`` after training."""
        return PeftRows(self, theta, base)


class PeftRows:
    """Trains a chunk's theta in place of its item table (an ItemRows factory and the rows).

    Item vector of compact row r of client j (item i): base_j[i] + f_theta_j(i).
    The backbone's row gradients g are mapped to theta by the chain rule
    (LoRA: dA_i = B^T g_i, dB = sum g_i a_i^T; bucket codecs: each bucket row
    gets w_j g_i), then one Adam step on theta (a fresh state each round, like
    the table's). A paper-mode gradient clip applies to theta's joint gradient.
    """

    def __init__(self, codec: PeftCodec, theta: dict[str, Tensor], base: Tensor | None) -> None:
        self.codec, self.base = codec, base
        self.theta = {n: theta[n].clone().contiguous() for n in codec.shapes}

    def __call__(self, q_start: Tensor, plan: Plan) -> _PeftItemRows:
        self.rows = _PeftItemRows(self.codec, self.theta, self.base, q_start, plan)
        return self.rows


class _PeftItemRows(ItemRows):
    def __init__(self, codec: PeftCodec, theta: dict[str, Tensor], base: Tensor | None,
                 q_start: Tensor, plan: Plan) -> None:
        self.codec, self.theta, self.plan = codec, theta, plan
        k, m, d = q_start.shape
        self.k, self.m, self.d = k, m, d
        self.bsz = plan.lab.shape[1]
        dev = q_start.device  # of every tensor here, as of the plan's
        self.ids = plan.ids.to(dev).reshape(-1)  # compact row -> item id
        # compact row -> client
        self.owner = torch.arange(k, device=dev).repeat_interleave(plan.rows)
        if base is None:  # the starting table minus f_theta_start: the client's frozen base
            self.base_full = q_start - codec.delta(theta)
        else:
            self.base_full = base.expand(k, m, d)
        self.base_rows = self.base_full.reshape(-1, d).index_select(
            0, self.owner * m + self.ids)
        self.names = list(codec.shapes)
        # per compact row: its row of A (LoRA), or its bucket rows in the flattened
        # (k * R, d) table (hash, RQ), client j's table starting at row j * R
        self.arow = self.owner * m + self.ids
        self._last: tuple[Tensor, Tensor] | None = None
        if codec.kind != "lora":
            assert codec.codes is not None
            self.table = theta[self.names[0]]
            r = self.table.shape[1]
            self.brows = codec.codes.index_select(0, self.ids) + (self.owner * r)[:, None]
        params = [theta[n] for n in self.names]
        self.grads, self.m1, self.m2 = adam_buffers(params)
        self.g = dict(zip(self.names, self.grads, strict=True))

    def _part(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """(f_theta rows (n, d), the operand the gradient needs: LoRA's a_i rows (n, k_L),
        or the bucket rows (n, nb) of a hash / RQ codec)."""
        n = flat.shape[0]
        if self.codec.kind == "lora":
            kl = self.theta["A"].shape[-1]
            a_rows = self.theta["A"].reshape(-1, kl).index_select(
                0, self.arow.index_select(0, flat))
            act = n // self.bsz
            part = torch.bmm(a_rows.view(act, self.bsz, kl),
                             self.theta["B"][:act].transpose(1, 2)).reshape(n, self.d)
            return part, a_rows
        assert self.codec.code_weights is not None
        idx = self.brows.index_select(0, flat)  # (n, nb)
        rows = self.table.reshape(-1, self.d).index_select(0, idx.reshape(-1)).view(
            n, -1, self.d)
        if self.codec.senet:
            act = n // self.bsz
            return self._senet_rows(rows, self.theta["W1"][:act], self.theta["W2"][:act]), idx
        return torch.einsum("nbd,b->nd", rows, self.codec.code_weights), idx

    def _senet_rows(self, rows: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
        """sum_j w_ij v_ij (equation 8) for a step's rows (n, h, d): the batches of clients
        0 .. a - 1 in order, B rows each, weighted by those clients' SENets w1, w2 (a, ...)."""
        a, nb = w1.shape[0], rows.shape[1]
        w = senet_weights(rows.mean(-1).view(a, -1, nb), w1, w2).view(-1, nb)  # (n, h)
        return (w.unsqueeze(-1) * rows).sum(1)

    def gather(self, flat: Tensor) -> Tensor:
        part, aux = self._part(flat)
        self._last = (flat, aux)  # add_grad of the same step reuses it (theta is unchanged)
        return part.add_(self.base_rows.index_select(0, flat))

    def add_grad(self, flat: Tensor, grad_rows: Tensor) -> None:
        aux = self._last[1] if self._last is not None and self._last[0] is flat else \
            self._part(flat)[1]
        n = flat.shape[0]
        if self.codec.kind == "lora":
            kl = self.theta["A"].shape[-1]
            act = n // self.bsz
            g3 = grad_rows.view(act, self.bsz, self.d)
            self.g["A"].view(-1, kl).index_add_(
                0, self.arow.index_select(0, flat),
                torch.bmm(g3, self.theta["B"][:act]).reshape(n, kl))
            self.g["B"][:act] += torch.bmm(g3.transpose(1, 2), aux.view(act, self.bsz, kl))
            return
        assert self.codec.code_weights is not None
        if self.codec.senet:  # the weights depend on H and on W1, W2: autograd on the rows
            act = n // self.bsz
            with torch.enable_grad():
                rows = self.table.reshape(-1, self.d).index_select(0, aux.reshape(-1)).view(
                    n, -1, self.d).detach().requires_grad_(True)
                w1 = self.theta["W1"][:act].detach().requires_grad_(True)
                w2 = self.theta["W2"][:act].detach().requires_grad_(True)
                part = self._senet_rows(rows, w1, w2)
                g_rows, g1, g2 = torch.autograd.grad(part, (rows, w1, w2), grad_rows)
            self.g["H"].view(-1, self.d).index_add_(0, aux.reshape(-1),
                                                    g_rows.reshape(-1, self.d))
            self.g["W1"][:act] += g1
            self.g["W2"][:act] += g2
            return
        w = self.codec.code_weights
        contrib = (grad_rows[:, None, :] * w[None, :, None]).reshape(-1, self.d)
        self.grads[0].view(-1, self.d).index_add_(0, aux.reshape(-1), contrib)

    def step(self, a: int, flat: Tensor, s: int, cfg: LocalTrainConfig) -> None:
        self._last = None
        grads = [g[:a] for g in self.grads]
        if cfg.grad_clip is not None:  # L2 clip of each client's joint theta gradient
            norms = torch.sqrt(sum(g.reshape(a, -1).double().pow(2).sum(dim=1) for g in grads))
            scale = torch.clamp(cfg.grad_clip / norms.clamp(min=1e-300), max=1.0)
            for g in grads:
                g.mul_(scale.to(g.dtype).reshape((a,) + (1,) * (g.dim() - 1)))
        fused_adam([self.theta[n][:a] for n in self.names], grads, [t[:a] for t in self.m1],
                   [t[:a] for t in self.m2], s + 1, cfg)
        for g in grads:
            g.zero_()

    def close(self) -> tuple[Tensor, Tensor]:
        q_local = self.codec.delta(self.theta).add_(self.base_full)
        dev = q_local.device
        touched = torch.zeros((self.k, self.m), dtype=torch.bool, device=dev)
        keep = self.plan.valid.to(dev).reshape(-1)
        touched.view(-1)[(self.owner * self.m + self.ids)[keep]] = True
        return q_local, touched


def senet_weights(s: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """FedPEFT's equation 7: w = sigmoid(W2 relu(W1 s)), batched over the first axis.

    s (k, n, h) squeezed hash vectors (equation 6), W1 (k, h1, h), W2 (k, h, h1);
    returns (k, n, h).
    """
    hidden = torch.relu(torch.bmm(s, w1.transpose(1, 2)))
    return torch.sigmoid(torch.bmm(hidden, w2.transpose(1, 2)))


def code_itemsize(codebook: int) -> int:
    """Bytes of one code: the smallest unsigned integer holding ``codebook`` values."""
    return 1 if codebook <= 256 else 2 if codebook <= 65536 else 4


def hash_codes(m: int, h: int, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """h universal hash functions ((a i + b) mod p) mod size over items 0..m-1.

    FedPEFT paper, equation 3 (after Zhang et al. 2025): a != 0, a != b,
    p = :data:`HASH_PRIME`. Returns ((h, 2) the (a, b), (m, h) the bucket rows).
    """
    ab = torch.empty((h, 2), dtype=torch.long)
    for j in range(h):
        while True:
            a = int(torch.randint(1, HASH_PRIME, (1,), generator=gen))
            b = int(torch.randint(0, HASH_PRIME, (1,), generator=gen))
            if a != b:
                break
        ab[j, 0], ab[j, 1] = a, b
    items = torch.arange(m, dtype=torch.long)
    codes = torch.stack([((ab[j, 0] * items + ab[j, 1]) % HASH_PRIME) % size
                         for j in range(h)], dim=1)
    return ab, codes


def residual_kmeans(x: np.ndarray, levels: int, codebook: int, seed: int) -> np.ndarray:
    """Semantic codes (m, levels) by residual quantisation: k-means per level on the residual.

    Level j clusters r_j (r_0 = x) into ``codebook`` centroids o_j; c_j is the
    nearest centroid and r_{j+1} = r_j - o_{j, c_j} (FedPEFT paper, equations
    7-9, with k-means in place of RQ-VAE training, as its codebooks are
    initialised). With fewer items than ``codebook`` each item gets its own code.
    """
    from sklearn.cluster import KMeans

    m = x.shape[0]
    codes = np.zeros((m, levels), dtype=np.int64)
    r = x.copy()
    for j in range(levels):
        k = min(codebook, m)
        km = KMeans(n_clusters=k, n_init=1, random_state=seed + j).fit(r)
        codes[:, j] = km.labels_
        r = r - km.cluster_centers_[km.labels_]
    return codes


Codec = FullCodec | PeftCodec
