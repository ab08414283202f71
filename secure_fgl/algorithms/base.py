"""What the algorithms share: the model exchange's public plan and DP request, and accuracy counts.

FedAvg's model mean (McMahan et al., AISTATS 2017, Algorithm 1; the client logic in
:mod:`.fedavg.client`, the server strategy in :mod:`.fedavg.server`): ``w = sum_k n_k w_k / sum_k n_k``
(``n_k`` = training nodes of client ``k``) through the protocol's weighted-mean exchange (tag
``<name>/model``); clients send their update ``w_k - w`` (the quantity DP-FedAvg clips; McMahan et
al., ICLR 2018).  The weights are divided by the public size of the training split, so each is in
``[0, 1]`` and they total 1 under full participation; the exchange is planned by
:class:`protocols.precision.MeanPrecision` from these public bounds (:func:`model_precision`), so
the averaged update is within ``FLOAT32_MEAN_TOLERANCE`` of the exact mean.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protocols import DPRequest, ValueSpec
from protocols.precision import FLOAT32_MEAN_TOLERANCE, MeanPrecision, grid_tolerance

from ..runtime.messages import FitRes

#: public bound on |parameter| carried by model exchanges; larger weights are refused
PARAM_BOUND = 100.0


#: target of a model mean on the public grid (:func:`model_spec` with ``grid``) for parameters up to 4:
#: 2^-22, the float32 rounding error of a parameter of size 4 (:func:`grid_model_tolerance` scales it)
GRID_MODEL_TOLERANCE = 2.0**-22


def grid_model_tolerance(value_bound: float) -> float:
    """Target of a grid model mean with public bound ``B`` on update entries.

    The float32 rounding error of a parameter of size ``max(4, B)``, ``2^(floor(log2 max(4, B)) - 24)`` --
    :data:`GRID_MODEL_TOLERANCE` up to ``B < 8``, ``2^-18`` at the default ``B = 100``. A bound-independent target
    would make the grid finer as ``B`` grows (the weight total's error enters as ``|mean| <= B``): at ``B = 100``
    and ten clients its sums need 43 bits, more than a CKKS slot half carries exactly (41); this one needs 38.
    """
    return 2.0 ** (math.floor(math.log2(max(4.0, float(value_bound)))) - 24)


def model_spec(
    num_contributors: int, num_clients: int, value_bound: float | None = None, *, grid: bool = False
) -> ValueSpec:
    """The model exchange's :class:`~protocols.base.ValueSpec`.

    :func:`model_precision`'s plan, or with ``grid`` its exact mean on the public grid
    (:meth:`protocols.precision.MeanPrecision.grid_spec`, target :func:`grid_model_tolerance`): every mode then
    averages to the same bits.
    """
    if not grid:
        return model_precision(num_contributors, num_clients, value_bound).spec()
    bound = value_bound or PARAM_BOUND
    return model_precision(
        num_contributors, num_clients, bound, tolerance=grid_tolerance(grid_model_tolerance(bound), num_clients)
    ).grid_spec(num_contributors)


def model_dp_request(cfg, dp, tag: str) -> DPRequest | None:
    """Client-level DP-FedAvg request on the model exchange when the run's DP scope covers ``tag``.

    Client-level DP-FedAvg on the model exchange when the run's DP scope (``dp``, the protocol's
    engine or None) covers ``tag``: updates clipped to ``--dp-clip``, one release per round.
    """
    dp_on = dp is not None and dp.config.in_scope(tag)
    return DPRequest(clip=cfg.dp_clip, releases=cfg.rounds) if dp_on else None


def model_precision(
    num_contributors: int,
    num_clients: int,
    value_bound: float | None = None,
    *,
    tolerance: float = FLOAT32_MEAN_TOLERANCE,
) -> MeanPrecision:
    """Precision plan of a model-averaging exchange.

    The weights lie in ``[0, 1]`` and total 1 over all clients: ``T_min = 1`` under full participation (exact), else
    the expected share ``m / K`` of the sampled clients (a planning value; the recipients' bound
    :meth:`~protocols.precision.MeanPrecision.error_bound` with the decoded total holds regardless).
    ``value_bound``: the public bound on update entries (``--update-bound``; default :data:`PARAM_BOUND`); packed
    fixed point takes its quantum from it.
    """
    share = 1.0 if num_contributors >= num_clients else num_contributors / num_clients
    return MeanPrecision(
        value_bound=value_bound or PARAM_BOUND, weight_bound=1.0, min_weight_total=share, tolerance=tolerance
    )


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(correct, total) over ``mask``."""
    total = int(mask.sum())
    if total == 0:
        return 0, 0
    return int((logits[mask].argmax(-1) == y[mask]).sum()), total


SPLITS = ("train", "val", "test")


def accuracy_summary(counts: dict[int, dict[str, tuple[int, int]]]) -> dict:
    """Accuracy per client, overall (node-weighted) and mean over clients (unweighted).

    ``counts`` maps client -> split -> ``(correct, total)``.
    """
    per_client, sums = [], {s: [0, 0] for s in SPLITS}
    for k in sorted(counts):
        row = {"client": k}
        for split in SPLITS:
            correct, total = (int(v) for v in counts[k][split])
            sums[split][0] += correct
            sums[split][1] += total
            row[f"{split}_acc"] = correct / total if total else None
            row[f"num_{split}"] = total
        per_client.append(row)
    out = {f"{s}_acc": (v[0] / v[1] if v[1] else 0.0) for s, v in sums.items()}
    for split in ("val", "test"):
        accs = [r[f"{split}_acc"] for r in per_client if r[f"{split}_acc"] is not None]
        out[f"{split}_acc_client_mean"] = float(np.mean(accs)) if accs else 0.0
    out["per_client"] = per_client
    return out


def train_loss_of(replies: dict[int, FitRes], losses: list[float]) -> dict:
    """The round's ``train_loss`` from the clients' local-update replies (empty when a client withheld it).

    A DP-SGD client keeps its loss, computed from un-noised gradients, to itself: then the round reports none.
    """
    if any(r.trained and r.loss is None for r in replies.values()):
        return {}
    return {"train_loss": float(np.mean(losses)) if losses else 0.0}
