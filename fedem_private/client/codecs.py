"""Upload codecs: what a client's shared groups look like on the wire, and back.

A codec (DESIGN section 9, and section 11 for FedPEFT's) turns a chunk's
shared groups (item table (k, m, d) and dense groups such as an MLP) into one
upload tensor (k, rows, d), and the server decodes an upload into the
item-table and dense groups it implies. The privacy mechanism clips and
noises the encoded upload as a whole, so every value that leaves the client
is covered; aggregation and the attacks see the decoded item table.

``full``: the item table itself, with the dense groups flattened and
zero-padded into extra rows of width d below it. With no dense groups the
upload *is* the item table (no copy).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CODECS = ("full",)


class FullCodec:
    """The whole item table (and dense groups as extra rows) is uploaded."""

    name = "full"

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
        ones = torch.ones((k, self.extra_rows), dtype=torch.bool)
        return torch.cat([touched_items, ones], dim=1)


def build(name: str, n_items: int, dim: int,
          dense_shapes: dict[str, tuple[int, ...]]) -> FullCodec:
    """The codec called ``name`` (one of :data:`CODECS`)."""
    if name == "full":
        return FullCodec(n_items, dim, dense_shapes)
    raise ValueError(f"unknown codec {name!r}")
