"""FedPEFT's server-side pre-training of the item table from item attributes.

FedPEFT paper (reference 003), section "Pre-train": before federated
training the server encodes each item's attributes into an input vector x,
trains an autoencoder (encoder E, decoder D) on the reconstruction loss

    L_AE = ||x - D(E(x))||^2,

and uses every item's latent vector z = E(x) as its initial full item
embedding. Here (docs/design.md section 11):

- x comes from :func:`fedem_private.data.attributes.item_attributes` (genre
  flags and a title TF-IDF; the paper's sentence-t5 encoder is not used, as
  nothing is downloaded);
- E and D have one hidden layer each, with ReLU, mirror images of each other
  (the paper uses [768, 512, 256, 128, 32] with ReLU for its 768-wide
  sentence-t5 inputs; ours are about 300 wide, so one hidden layer):
  E(x) = W2 relu(W1 x + b1) + b2, D(z) = W4 relu(W3 z + b3) + b4;
- training is full batch (every item at once, so no shuffling), Adam on the
  mean squared error over all entries (L_AE / (n k_p): the same minimiser),
  for a fixed number of epochs, in float64; the weights are drawn from a
  generator keyed by (seed, :attr:`~fedem_private.rng.Stream.PRETRAIN`), so
  the table is a function of (attributes, seed, dimension, init_std);
- the latent table is centred (each dimension's mean over the items is
  removed) and rescaled so that its entries have standard deviation
  ``init_std``, the scale of the random initial table it replaces
  (N(0, init_std^2)). The backbones' learning rates and the codecs' theta
  initialisation are tuned to that scale, and an AE's latent scale is
  arbitrary (any rescaling of E is undone by D), so only its direction
  structure is kept. The centring removes a direction common to every item,
  which tells no items apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedem_private import rng

#: the client id keying the server's pre-training draws (as the other server-side draws)
SERVER = 1 << 40


@dataclass(frozen=True)
class AEConfig:
    """The autoencoder's shape and training (FedPEFT paper, section "Pre-train")."""

    hidden: int = 64  # width of E's and D's hidden layer
    epochs: int = 300  # full-batch Adam steps
    lr: float = 0.01  # Adam's step size


@dataclass(frozen=True)
class Pretrained:
    """The outcome: the initial item table and the reconstruction error before and after."""

    table: Tensor  # (m, d) the centred, rescaled latent table
    mse_start: float  # reconstruction MSE of the untrained autoencoder
    mse_end: float  # ... after training


def init_autoencoder(n_in: int, dim: int, hidden: int, seed: int) -> dict[str, Tensor]:
    """E's and D's weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), keyed by the run seed.

    The weights and biases of x -> hidden -> z (E) and z -> hidden -> x (D),
    float64, drawn in a fixed order from (seed, Stream.PRETRAIN, 0, SERVER)
    (FedPEFT paper, section "Pre-train").
    """
    gen = rng.generator(seed, rng.Stream.PRETRAIN, 0, SERVER)
    shapes = {"w1": (hidden, n_in), "b1": (hidden,), "w2": (dim, hidden), "b2": (dim,),
              "w3": (hidden, dim), "b3": (hidden,), "w4": (n_in, hidden), "b4": (n_in,)}
    fan_in = {"1": n_in, "2": hidden, "3": dim, "4": hidden}
    params = {}
    for name, shape in shapes.items():
        bound = 1.0 / math.sqrt(max(fan_in[name[1]], 1))
        u = torch.rand(shape, generator=gen, dtype=torch.float64)
        params[name] = (u * 2.0 - 1.0) * bound
    return params


def encode(params: dict[str, Tensor], x: Tensor) -> Tensor:
    """z = E(x) = W2 relu(W1 x + b1) + b2, rows of x (n, k_p) -> (n, d)."""
    h = torch.relu(x @ params["w1"].T + params["b1"])
    return h @ params["w2"].T + params["b2"]


def decode(params: dict[str, Tensor], z: Tensor) -> Tensor:
    """x_hat = D(z) = W4 relu(W3 z + b3) + b4, (n, d) -> (n, k_p)."""
    h = torch.relu(z @ params["w3"].T + params["b3"])
    return h @ params["w4"].T + params["b4"]


def reconstruction_mse(params: dict[str, Tensor], x: Tensor) -> Tensor:
    """Mean over all entries of (x - D(E(x)))^2 (FedPEFT's L_AE divided by n k_p)."""
    return (decode(params, encode(params, x)) - x).pow(2).mean()


def train_autoencoder(x: Tensor, dim: int, seed: int, cfg: AEConfig = AEConfig()
                      ) -> tuple[dict[str, Tensor], float, float]:
    """Train E and D on the items' attributes x (m, k_p) with full-batch Adam on the MSE.

    FedPEFT paper, section "Pre-train". Returns (weights, MSE before, MSE after).
    """
    x = x.to(torch.float64)
    params = {n: p.requires_grad_(True) for n, p in
              init_autoencoder(x.shape[1], dim, cfg.hidden, seed).items()}
    opt = torch.optim.Adam(list(params.values()), lr=cfg.lr)
    with torch.no_grad():
        start = float(reconstruction_mse(params, x))
    for _ in range(cfg.epochs):
        opt.zero_grad(set_to_none=False)
        reconstruction_mse(params, x).backward()
        opt.step()
    with torch.no_grad():
        end = float(reconstruction_mse(params, x))
    return {n: p.detach() for n, p in params.items()}, start, end


def rescale(z: Tensor, std: float) -> Tensor:
    """Centre each column of z and scale the whole table so its entries have std ``std``.

    The standard deviation is over all m * d entries (population, ddof 0). A
    table with no spread (every item the same latent) becomes zeros.
    """
    z = z - z.mean(dim=0, keepdim=True)
    spread = float(z.pow(2).mean().sqrt())
    return z * (std / spread) if spread > 0 else torch.zeros_like(z)


def pretrain_items(features: np.ndarray, dim: int, seed: int, init_std: float,
                   cfg: AEConfig = AEConfig(), dtype: torch.dtype = torch.float32
                   ) -> Pretrained:
    """FedPEFT's initial item table: an autoencoder's latent z = E(x) of each item's attributes.

    FedPEFT paper, section "Pre-train". ``features`` (m, k_p) is row i = item
    i's attribute vector x_i; the result's table (m, ``dim``) is row i = item
    i's latent, centred and rescaled to entries of std ``init_std`` (see the
    module docstring), in ``dtype``.
    """
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float64))
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (items, attributes) matrix, "
                         f"got shape {tuple(x.shape)}")
    params, start, end = train_autoencoder(x, dim, seed, cfg)
    with torch.no_grad():
        table = rescale(encode(params, x), init_std)
    return Pretrained(table.to(dtype), start, end)
