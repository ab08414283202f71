"""Minority-node accuracy (FedSpray, Fu et al., KDD 2024, sec. 5.1.3 and Table 2).

A client's *minority* test nodes are its test nodes whose label is not the client's
majority class; the majority class is the most frequent label among the client's
*training* nodes (what the client can know; reference code ``client.py``,
``print_count_nodes_per_class``).  The reported number is node-weighted over clients:
``sum_k correct_k / sum_k minority_k``.

Each client reports its part (:func:`minority_report`) with its evaluation counts;
:class:`MinorityAccuracy` is a mixin for a server strategy: :meth:`~MinorityAccuracy.add_minority`
adds ``minority_acc`` to an ``evaluate()`` dict, and ``final_metrics()`` returns the value at the
round the engine reports (best validation accuracy, first such round — the same rule as
:func:`secure_fgl.engine.trainer.train`), so ``result['final']['minority_acc']`` sits next to
``final.test_acc`` for the same model state.  :class:`MinorityLogic` and
:class:`MinorityStrategy` are FedAvg (and, with ``aggregate_models`` off, Local) reporting it: the
FedSpray Table 2 baselines (``examples/fedspray_table2.py``).
"""

from __future__ import annotations

import torch

from ..runtime.messages import EvaluateIns, EvaluateRes
from ..runtime.strategy import EVAL_TAG
from .base import accuracy_summary
from .fedavg.client import ModelAveragingLogic
from .fedavg.server import ModelAveragingStrategy


def majority_class(y: torch.Tensor, train_mask: torch.Tensor, num_classes: int) -> int:
    """Most frequent training label (lowest class id on ties); 0 without training nodes."""
    if not bool(train_mask.any()):
        return 0
    return int(torch.bincount(y[train_mask], minlength=num_classes).argmax())


def minority_counts(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, majority: int) -> tuple[int, int]:
    """(correct, total) over the nodes of ``mask`` whose label is not ``majority``."""
    sel = mask & (y != majority)
    total = int(sel.sum())
    if total == 0:
        return 0, 0
    return int((logits[sel].argmax(-1) == y[sel]).sum()), total


def minority_report(logits: torch.Tensor, c, num_classes: int) -> dict:
    """One client's part of the minority-accuracy metric.

    One client's part of the metric: its majority class and minority ``(correct, total)`` on its
    test and validation nodes (what the client reports; it needs only its own data).
    """
    majority = majority_class(c.y, c.train_mask, num_classes)
    return {
        "majority_class": majority,
        **{split: minority_counts(logits, c.y, getattr(c, f"{split}_mask"), majority) for split in ("test", "val")},
    }


class MinorityAccuracy:
    """Mixin: ``minority_acc`` in ``evaluate()`` and in ``final_metrics()`` (best-val round)."""

    def _minority_tracker(self) -> dict:
        return self.__dict__.setdefault(
            "_minority_best", {"val_acc": None, "minority_acc": None, "val_minority_acc": None, "last": None}
        )

    def add_minority(self, out: dict, reports: dict[int, dict]) -> dict:
        """Add the clients' minority reports to an ``evaluate()`` dict.

        ``out`` (an ``evaluate()`` dict) with the clients' :func:`minority_report` entries: per-client
        rows, the node-weighted ``minority_acc`` / ``val_minority_acc``, and the best-val tracker.
        """
        sums = {"test": [0, 0], "val": [0, 0]}
        for row in out["per_client"]:
            rep = reports[row["client"]]
            row["majority_class"] = rep["majority_class"]
            for split, acc in sums.items():
                corr, tot = (int(v) for v in rep[split])
                acc[0] += corr
                acc[1] += tot
                row[f"{'' if split == 'test' else 'val_'}minority_acc"] = corr / tot if tot else None
                row[f"num_{split}_minority"] = tot
        out["minority_acc"] = sums["test"][0] / sums["test"][1] if sums["test"][1] else 0.0
        out["val_minority_acc"] = sums["val"][0] / sums["val"][1] if sums["val"][1] else 0.0
        best = self._minority_tracker()
        best["last"] = out["minority_acc"]
        if best["val_acc"] is None or out["val_acc"] > best["val_acc"]:  # the engine's rule
            best.update(
                val_acc=out["val_acc"], minority_acc=out["minority_acc"], val_minority_acc=out["val_minority_acc"]
            )
        return out

    def final_metrics(self) -> dict:
        """Base metrics plus the minority-class accuracy at the best round and at the last."""
        best = self._minority_tracker()
        return {
            **super().final_metrics(),
            "minority_acc": best["minority_acc"],
            "val_minority_acc": best["val_minority_acc"],
            "last_minority_acc": best["last"],
        }

    def state_dict(self) -> dict:
        """Base checkpoint plus the minority tracker."""
        return {**super().state_dict(), "minority_best": dict(self._minority_tracker())}

    def load_state_dict(self, state: dict) -> None:
        """Restore the checkpoint and the minority tracker."""
        state = dict(state)
        saved = state.pop("minority_best", None)
        super().load_state_dict(state)
        if saved is not None:
            self._minority_tracker().update(saved)


class MinorityLogic(ModelAveragingLogic):
    """FedAvg's client whose evaluation counts carry its :func:`minority_report`."""

    @torch.no_grad()
    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """Per-split counts plus the minority-class report."""
        counts = super().evaluate(req).counts
        return EvaluateRes({**counts, "minority": minority_report(self.logits(), self.data, self.facts.num_classes)})


class MinorityStrategy(MinorityAccuracy, ModelAveragingStrategy):
    """FedAvg's server reporting minority accuracy.

    ``local`` in the algorithm's name: Local training (each client alone, nothing exchanged).
    """

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.aggregate_models = not cfg.algorithm.startswith("local")
        self.personalized = not self.aggregate_models

    def evaluate(self) -> dict:
        """Accuracy summary plus the minority-class accuracies."""
        asked = self.ask("evaluate", {k: EvaluateIns() for k in self.alive()}, record=(EVAL_TAG, "plain"))
        reports = {k: r.counts for k, r in asked.items()}
        return self.add_minority(accuracy_summary(reports), {k: r["minority"] for k, r in reports.items()})
