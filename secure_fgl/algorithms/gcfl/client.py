"""GCFL's and GCFL+'s client.

Xie et al., NeurIPS 2021. The baselines' GIN client, plus the norms it reports and its part of the update similarity
(the cosine matrix); :mod:`.server` describes the clustering.
"""

from __future__ import annotations

import numpy as np

from ...runtime.messages import ContributeIns, ContributeRes, ReceiveIns
from ..graph_level.client import GraphLogic


class GCFLLogic(GraphLogic):
    """A GCFL/GCFL+ client.

    :class:`~.graph_level.GraphLogic` plus the scalars it reports and its update for the update-similarity exchange
    (its protocol half does the rest; a decider's key stays there).
    """

    def scalar(self, tag: str) -> float | None:
        """The value this client reports for ``tag`` (None: not a report tag)."""
        name = self.cfg.algorithm
        if tag == f"{name}/mean_norm":  # eq. 4's mean: the FedAvg mean, or the unweighted one
            return float(np.linalg.norm(self.mean if self.criterion_mean is None else self.criterion_mean))
        if tag == f"{name}/update_norms":
            return float(self.learner.update().norm())
        if tag == f"{name}/grad_norms":
            return float(self.learner.grad_norm)
        return None

    #: ``--mean-norm unweighted``: the cluster's unweighted mean update, which only eq. 4 reads
    criterion_mean: np.ndarray | None = None

    def weight(self, tag: str) -> float | None:
        """``--mean-norm unweighted``'s mean (tag ``<algorithm>/criterion_mean``): equal weights ``1 / K``."""
        if tag == f"{self.cfg.algorithm}/criterion_mean":
            return 1.0 / self.facts.num_clients
        return super().weight(tag)

    def receive(self, req: ReceiveIns) -> None:
        """Store the cluster's unweighted mean (eq. 4's criterion), else the graph-level results."""
        if req.tag == f"{self.cfg.algorithm}/criterion_mean":
            self.criterion_mean = self.received_mean(req)
            return None
        return super().receive(req)

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Report the round's norms in the clear, or keep the update for the similarity exchange."""
        tag, name = req.tag, self.cfg.algorithm
        if tag == f"{name}/norms":  # one report of every norm of the round (algorithms.gcfl)
            values = np.array([self.scalar(f"{name}/{part}") for part in req.entry("parts")], dtype=np.float64)
            self.keep(tag, values, clear=True)  # the half sends it, signed (protocols/report.py)
            return ContributeRes()
        if tag == f"{name}/similarity":
            update = self.learner.update().cpu().numpy()
            self.keep(tag, update.astype(np.float64))  # the half sends it to the update-similarity exchange
            return ContributeRes(length=update.size)
        return super().contribute(req)
