"""Names for people: what plots, legends and tables show in place of internal labels
(issue 80: a legend read ``fedem-em-fedavg`` and ``projection_control``). A leaf: imports
nothing of ours, so every figure and table module can use it.

A results row's ``variant`` (:func:`~fedem_private.experiments.sweep_spec.variant_label`)
is the method, then what differs from its preset, joined by ``-`` (merge, aggregation,
FedMerge's ``k``, the adapter's objective and folds), a backbone after ``+``, a codec after
``~``, and a report's settings in brackets; :func:`variant_display` writes each part by its
name in the papers and the docs.
"""

from __future__ import annotations

import re

METHOD_NAMES = {
    "fedmf": "FedMF", "fedsim": "FedSim", "fedem": "FedEM", "local": "Local",
    "fedncf": "FedNCF", "pfedrec": "PFedRec", "gpfedrec": "GPFedRec", "fedrap": "FedRAP",
    "fedmerge": "FedMerge", "mostpop": "MostPop", "dp-mostpop": "DP-MostPop",
    "centralised": "centralised MF", "ease": "EASE", "als": "ALS",
}
AGGREGATION_NAMES = {"fedavg": "FedAvg", "uniform": "uniform mean",
                     "similarity": "similarity-weighted", "graph": "graph",
                     "fedmerge": "FedMerge", "none": "no aggregation"}
MERGE_NAMES = {"em": "EM", "sr": "SR", "sm": "SM", "dm": "DM", "none": "no merge"}
BACKBONE_NAMES = {"mf": "MF", "ncf": "NCF", "mlp": "MLP"}
# methods whose name already says their merge (FedEM is elastic merging, EM)
IMPLIED_MERGE = {"fedem": "em"}


def method_display(method: str) -> str:
    """A method's name as written in the docs (``fedem`` -> ``FedEM``); unknown: as is."""
    return METHOD_NAMES.get(method, method)


def _method_prefix(base: str) -> str:
    """The longest known method name ``base`` starts with (``dp-mostpop-x`` ->
    ``dp-mostpop``), else its first ``-`` part."""
    known = [m for m in METHOD_NAMES if base == m or base.startswith(m + "-")]
    return max(known, key=len) if known else base.split("-", 1)[0]


def _qualifier(token: str, method: str) -> str | None:
    """What one ``-`` part of a variant label says, for people (None: nothing to say)."""
    if token in MERGE_NAMES:
        return None if IMPLIED_MERGE.get(method) == token else f"{MERGE_NAMES[token]} merge"
    if token in AGGREGATION_NAMES:
        return AGGREGATION_NAMES[token]
    k = re.fullmatch(r"k(\d+)", token)
    if k:
        return f"K={k.group(1)}"
    folds = re.fullmatch(r"f(\d+)", token)
    if folds:
        return f"{folds.group(1)} folds"
    return token


def variant_display(variant: str) -> str:
    """A results row's variant as people name it: ``fedem-em-fedavg`` -> ``FedEM (FedAvg)``,
    ``fedmf-em`` -> ``FedMF (EM merge)``, ``fedem-em+ncf~hash`` -> ``FedEM (NCF, codec
    hash)``, ``ease [ease_lambda=500]`` -> ``EASE [ease_lambda=500]`` (a report's settings
    stay as written)."""
    text = str(variant)
    label, sep, settings = text.partition(" [")
    label, _, codec = label.partition("~")
    label, _, backbone = label.partition("+")
    method = _method_prefix(label)
    rest = [t for t in label[len(method):].split("-") if t]
    parts = [q for q in (_qualifier(t, method) for t in rest) if q]
    if backbone:
        parts.append(BACKBONE_NAMES.get(backbone, backbone))
    if codec:
        parts.append(f"codec {codec}")
    out = method_display(method) + (f" ({', '.join(parts)})" if parts else "")
    return out + (f" [{settings}" if sep else "")


def attack_display(name: str) -> str:
    """An attack's column name for people: ``projection_control`` -> ``projection control``."""
    return str(name).replace("_", " ")
