"""Gradient inversion against model-update exchanges.

The victim client ``v`` uploads ``[w_v * Delta_v, w_v]`` (``Protocol.weighted_mean``), where
``Delta_v`` is its local update on its subgraph.  The attacker knows the model architecture
and hyper-parameters (public), the global parameters the round started from and -- declared
K2 knowledge -- the victim's local edge index and training mask.  It optimises dummy node
features ``X~`` (sigmoid-parametrised for binary bag-of-words features) and soft labels so that
the update they would produce matches the observed one in cosine distance (Inverting
Gradients, Geiping et al. 2020; DLG, Zhu et al. 2019, with joint label optimisation), with an
iDLG-style label prior from the last-layer bias (Zhao et al. 2020: a class whose bias moves up
is over-represented among the victim's training labels).  The simulated update is
``-grad`` (``update_rule='sgd'``) or the first Adam step ``-grad/|grad|`` (``'adam'``, a smooth
surrogate); the real local training (dropout, several epochs, persistent Adam state) differs,
so numbers on full runs are lower bounds of what a stronger attacker gets.

An analytic support test needs no optimisation: the first-layer weight column of a word no
victim node holds receives no data gradient, so its update is parallel to the weight column
(SGD + L2) or ``-lr sign(W)`` per local step (Adam + L2); the score is the column update's
deviation from that (:func:`support_scores`).  ``update_rule='auto'`` follows the run's public
``--optimizer``.

* :class:`GradientInversion` -- server, individual plaintext updates.
* :class:`AggregateGradientInversion` -- the same inversion on the aggregate an observer can
  read (secure modes: the server holds no readable aggregate, clients do).
* :class:`IsolatedGradientInversion` -- a coalition of the other ``K - 1`` clients (or the one
  other client when ``K = 2``) subtracts its own uploads from the aggregate and isolates the
  victim's update exactly, then inverts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols.transcript import SERVER, client_party, party_client

from .base import Attack, AttackResult, GroundTruth, View, attack_device, bit_f1, dense_vector, tv_distance
from .significance import auc_estimate, matching_chance, mean_estimate, proportion_estimate

EXCHANGE = "*/model"
#: algorithms whose model exchange is a GCN on the clients' raw local features
RAW_FEATURE_ALGORITHMS = ("fedavg", "fedprox")


# ----------------------------------------------------------------------------- reading updates
def model_tag(view: View, pattern: str = EXCHANGE) -> str | None:
    """The first model-exchange tag matching ``pattern`` in the view, or ``None``."""
    tags = view.tags(pattern)
    return tags[0] if tags else None


def _vector(view: View, m, P: int) -> np.ndarray | None:
    """``[w v, w]`` (P + 1 entries) of a readable message.

    An unweighted DP mean sends ``v`` alone (P entries) -- returned with a zero weight slot.
    """
    p = view.payload(m)
    vec = dense_vector(p) if p is not None else None
    if vec is None or vec.size < P:
        return None
    if vec.size == P:
        return np.concatenate([vec, [0.0]])
    return vec[: P + 1]


def read_uploads(view: View, tag: str, rnd: int, P: int) -> dict[int, np.ndarray]:
    """Readable upload vectors of round ``rnd``: client -> ``[w v, w]`` (``w = 0``: unweighted)."""
    out = {}
    for m in view.select(tag, receiver=SERVER, round=rnd):
        vec = _vector(view, m, P)
        k = party_client(m.sender)
        if vec is not None and k is not None:
            out[k] = vec
    return out


def read_aggregate(view: View, tag: str, rnd: int, P: int) -> np.ndarray | None:
    """The summed ``[sum w v, sum w]`` the server sent at round ``rnd``, if readable."""
    for m in view.select(tag, sender=SERVER, round=rnd):
        vec = _vector(view, m, P)
        if vec is not None:
            return vec
    return None


def split_weighted(vec: np.ndarray, pub: Mapping[str, Any], contributors: int = 1) -> tuple[np.ndarray, float]:
    """``[w v, w']`` -> ``(v, w)``.

    Under DP the weight coordinate is ``w~ C`` (protocols.dp); a zero weight slot marks an unweighted sum over
    ``contributors`` clients.
    """
    P = vec.size - 1
    w = float(vec[P])
    if w == 0.0:
        return vec[:P] / max(1, contributors), 0.0
    if pub.get("dp_epsilon"):
        w = w / float(pub.get("dp_clip") or 1.0)
    return (vec[:P] / w if abs(w) > 1e-12 else vec[:P]), w


def round_start_params(
    released: torch.Tensor, total: np.ndarray, pub: Mapping[str, Any], contributors: int = 1
) -> torch.Tensor:
    """Global parameters at the start of the last round: released - mean update."""
    mean, _ = split_weighted(total, pub, contributors)
    return released - torch.as_tensor(mean, dtype=released.dtype, device=released.device)


# ----------------------------------------------------------------------------- the inversion
def first_weight(model: torch.nn.Module, d: int) -> tuple[int, int, tuple[int, ...]] | None:
    """Locate the first weight that reads the ``d`` input features.

    Returns:
        ``(offset, numel, shape)`` in the flat parameter vector, or ``None``.
    """
    off = 0
    for p in model.parameters():
        if p.dim() == 2 and d in p.shape:
            return off, p.numel(), tuple(p.shape)
        off += p.numel()
    return None


def last_bias(model: torch.nn.Module, C: int) -> tuple[int, int] | None:
    """``(offset, C)`` in the flat parameter vector of the last 1-D parameter with ``C`` entries (the output bias)."""
    off, found = 0, None
    for p in model.parameters():
        if p.dim() == 1 and p.numel() == C:
            found = (off, C)
        off += p.numel()
    return found


def support_scores(
    update: np.ndarray,
    start: np.ndarray,
    model: torch.nn.Module,
    d: int,
    rule: str = "sgd",
    step: float = 0.0,
    weight_decay: float = 0.0,
) -> np.ndarray | None:
    """Score each input feature by how far its first-layer column update departs from a data-free one.

    The data-free update of column ``U_j`` is the one it gets with no data gradient (a word no victim node holds).

    SGD (+ L2): that update is parallel to the weight column ``W_j``; the score is the share of
    ``U_j`` orthogonal to ``W_j``.  Adam (+ L2): Adam normalises the weight-decay gradient
    ``lambda W`` to its sign, so that update is ``-step sign(W_j)`` (``step = lr x local steps``;
    zero without weight decay); the score is ``||U_j + step sign(W_j)|| / (step sqrt(h))``.
    """
    loc = first_weight(model, d)
    if loc is None:
        return None
    off, n, shape = loc
    U = update[off : off + n].reshape(shape)
    W = start[off : off + n].reshape(shape)
    if shape[0] != d:  # [h, d] -> columns as rows
        U, W = U.T, W.T
    if rule == "adam":
        quiet = -step * np.sign(W) if weight_decay else np.zeros_like(W)
        return np.linalg.norm(U - quiet, axis=1) / (max(step, 1e-30) * np.sqrt(U.shape[1]))
    un = np.linalg.norm(U, axis=1)
    wn = np.linalg.norm(W, axis=1)
    proj = (U * W).sum(1) / np.maximum(wn, 1e-12)
    perp = np.sqrt(np.maximum(un**2 - proj**2, 0.0))
    return np.where(un > 0, perp / np.maximum(un, 1e-30), 0.0)


def invert_update(
    model: torch.nn.Module,
    start: torch.Tensor,
    target: torch.Tensor,
    x_shape: tuple[int, int],
    edge_index: torch.Tensor,
    train_mask: torch.Tensor,
    num_classes: int,
    *,
    binary: bool,
    rule: str = "adam",
    iterations: int = 100,
    lr: float = 0.1,
    restarts: int = 1,
    weight_decay: float = 0.0,
    l1: float = 1e-3,
    label_prior: torch.Tensor | None = None,
    seed: int = 0,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Optimise dummy features/labels whose simulated update matches ``target`` in cosine.

    Returns ``(features [n, d], label probabilities [n_train, C], final loss)``.
    """
    dev = device or attack_device()
    model = model.to(dev)
    model.eval()  # no dropout: the attacker cannot replay it
    vector_to_parameters(start.to(dev).clone(), model.parameters())
    params = [p for p in model.parameters()]
    target = target.to(dev).float()
    ei = edge_index.to(dev)
    tm = train_mask.to(dev)
    n, d = x_shape
    nt = int(tm.sum())
    best = None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for r in range(max(1, restarts)):
        zx = (torch.randn(n, d, generator=gen) * 0.1 + (-1.0 if binary else 0.0)).to(dev).requires_grad_(True)
        zy = torch.zeros(nt, num_classes)
        if label_prior is not None:
            zy = zy + label_prior.log().clamp_min(-10)[None, :]
        zy = (zy + torch.randn(nt, num_classes, generator=gen) * 0.01).to(dev).requires_grad_(True)
        opt = torch.optim.Adam([zx, zy], lr=lr)
        loss_v = float("inf")
        for it in range(iterations):
            opt.zero_grad()
            x = torch.sigmoid(zx) if binary else zx
            logits = model(x, ei)
            yl = F.softmax(zy, dim=-1)
            ce = -(yl * F.log_softmax(logits[tm], dim=-1)).sum(-1).mean()
            grads = torch.autograd.grad(ce, params, create_graph=True)
            g = torch.cat([gr.reshape(-1) for gr in grads])
            if weight_decay:
                g = g + weight_decay * start.to(dev)
            if rule == "adam":
                tau = 1e-3 * g.detach().abs().mean().clamp_min(1e-12)
                sim = -g / torch.sqrt(g * g + tau * tau)
            else:
                sim = -g
            loss = 1 - F.cosine_similarity(sim, target, dim=0)
            if binary and l1:
                loss = loss + l1 * x.mean()
            loss.backward()
            opt.step()
            loss_v = float(loss.detach())
        with torch.no_grad():
            x = torch.sigmoid(zx) if binary else zx
            if best is None or loss_v < best[2]:
                best = (x.detach().cpu(), F.softmax(zy, -1).detach().cpu(), loss_v)
    return best


# ----------------------------------------------------------------------------- attacks
def receptive_field(edge_index: np.ndarray, seeds: np.ndarray, hops: int = 2) -> np.ndarray:
    """Nodes within ``hops`` of a seed node (seeds included)."""
    reach = seeds.copy()
    for _ in range(hops):
        nxt = reach.copy()
        if edge_index.size:
            nxt[edge_index[1][reach[edge_index[0]]]] = True
            nxt[edge_index[0][reach[edge_index[1]]]] = True
        reach = nxt
    return reach


class GradientInversion(Attack):
    """Server inverts one client's plaintext model update on its subgraph (K2 topology known)."""

    name = "gradient_inversion"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public", "architecture", "released_model", "victim_topology")
    algorithms = RAW_FEATURE_ALGORITHMS
    options = {"victim": 0, "iterations": 300, "lr": 0.1, "restarts": 2, "update_rule": "auto", "seed": 0, "hops": 2}

    # -- what to invert (overridden by the aggregate / isolation variants)
    def target_round(self, view: View, tag: str) -> int | None:
        """The latest round of ``tag`` the observer can read."""
        return view.latest_round(tag)

    def target_vector(self, view: View, tag: str, rnd: int, length: int, pub) -> tuple[np.ndarray, np.ndarray] | str:
        """``(victim [w v, w], total [sum w v, sum w])`` or a reason string."""
        ups = read_uploads(view, tag, rnd, length)
        v = int(self.opts["victim"])
        if v not in ups:
            return f"the victim's update in {tag} round {rnd} is not readable by the {view.parties[0]}"
        total = read_aggregate(view, tag, rnd, length)
        if total is None:
            if len(ups) < int(pub["num_clients"]):
                return "cannot rebuild the round's start point: not every upload nor the aggregate is readable"
            total = np.sum(list(ups.values()), axis=0)
        return ups[v], total

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Invert the victim's update on its known topology: features and labels whose update matches the observed one.

        A label prior comes from the last-layer bias update; under SGD the label shares follow in closed form (iDLG /
        LLG).
        """
        pub = knowledge["public"]
        tag = model_tag(view, self.exchange)
        if tag is None:
            return self.not_applicable("no model exchange in the transcript")
        model = knowledge["architecture"]()
        released = parameters_to_vector(knowledge["released_model"].parameters()).detach().cpu().double()
        P = released.numel()
        rnd = self.target_round(view, tag)
        if rnd is None:
            kinds = sorted({m.kind for m in view.select(tag)})
            return self.not_applicable(
                f"every {tag} payload is {'/'.join(kinds)} to the {'+'.join(view.parties)} (or no payload was kept)"
            )
        got = self.target_vector(view, tag, rnd, P, pub)
        if isinstance(got, str):
            return self.not_applicable(got)
        victim_vec, total = got
        contributors = (
            len({m.sender for m in view.select(tag, receiver=SERVER, round=rnd)}) if SERVER in view.parties else 0
        ) or int(pub["num_clients"])
        start = round_start_params(released, total, pub, contributors)
        update, _ = split_weighted(victim_vec, pub)
        topo = knowledge["victim_topology"]
        d, C = int(pub["num_features"]), int(pub["num_classes"])
        rule = self.opts["update_rule"]
        if rule == "auto":
            rule = "adam" if str(pub.get("optimizer", "adam")).lower() == "adam" else "sgd"
        # iDLG-style label prior from the last-layer bias: classes whose bias goes up are present
        prior = None
        lb = last_bias(model, C)
        if lb is not None:
            db = update[lb[0] : lb[0] + lb[1]]
            prior = torch.as_tensor(
                np.clip(db, 0, None) + 1e-3 * np.abs(db).max(initial=1e-12) + 1e-12, dtype=torch.float32
            )
            prior = prior / prior.sum()
        x_hat, y_hat, loss = invert_update(
            model,
            start.float(),
            torch.as_tensor(update, dtype=torch.float32),
            (int(topo["num_nodes"]), d),
            torch.as_tensor(topo["edge_index"]),
            torch.as_tensor(topo["train_mask"]).bool(),
            C,
            binary=bool(pub["binary_features"]),
            rule=rule,
            iterations=int(self.opts["iterations"]),
            lr=float(self.opts["lr"]),
            restarts=int(self.opts["restarts"]),
            weight_decay=float(pub.get("weight_decay") or 0.0),
            label_prior=prior,
            seed=int(self.opts["seed"]),
        )
        step = float(pub.get("lr") or 0.0) * max(1, int(pub.get("local_epochs") or 1))
        sup = support_scores(update, start.numpy(), model, d, rule, step, float(pub.get("weight_decay") or 0.0))
        presence, label_dist = None, None
        if lb is not None:
            db = update[lb[0] : lb[0] + lb[1]]
            presence = db > 0  # Adam keeps only the sign: a class whose bias rises is over-represented
            if rule == "sgd" and pub.get("lr"):
                # g_b = mean_train(p - y) = -db / lr  =>  label shares ~ mean p - g_b (iDLG / LLG)
                with torch.no_grad():
                    model.eval()
                    vector_to_parameters(start.float().to(x_hat.device), model.parameters())
                    tm = torch.as_tensor(topo["train_mask"]).bool()
                    p = (
                        F.softmax(
                            model(
                                x_hat.to(next(model.parameters()).device),
                                torch.as_tensor(topo["edge_index"]).to(next(model.parameters()).device),
                            ),
                            -1,
                        )[tm.to(next(model.parameters()).device)]
                        .mean(0)
                        .cpu()
                        .numpy()
                    )
                est = np.clip(p + db / float(pub["lr"]), 0, None)
                if est.sum() > 0:
                    label_dist = est / est.sum()
                    presence = est * int(torch.as_tensor(topo["train_mask"]).sum()) >= 0.5
        return self.result(
            output={
                "victim": int(topo.get("client", self.opts["victim"])),
                "x": x_hat.numpy(),
                "y": y_hat.numpy(),
                "support": sup,
                "presence": presence,
                "label_dist": label_dist,
                "loss": loss,
                "round": rnd,
                "rule": rule,
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Feature AUC (binary) or cosine against a mean-feature baseline, over the training nodes' receptive field."""
        out = res.output
        c = truth.clients[out["victim"]]
        X = c.x.detach().cpu().numpy().astype(np.float64)
        y = c.y.detach().cpu().numpy()
        tm = c.train_mask.detach().cpu().numpy().astype(bool)
        xh = out["x"]
        # only nodes within the model's receptive field of a training node shape the update
        field = receptive_field(c.edge_index.detach().cpu().numpy(), tm, hops=int(self.opts.get("hops", 2)))
        X, xh = X[field], xh[field]
        m: dict[str, Any] = {
            "victim": out["victim"],
            "round": out["round"],
            "update_rule": out["rule"],
            "match_loss": out["loss"],
            "receptive_nodes": int(field.sum()),
        }
        if truth.binary:
            rows = np.repeat(np.arange(X.shape[0]), X.shape[1])
            res.add(auc_estimate("feature_auc", xh.ravel(), X.ravel() > 0.5, groups=rows), primary=True)
            k = max(1, int(round((X > 0.5).sum(1).mean())))
            top = np.argsort(-xh, axis=1)[:, :k]
            pred = np.zeros_like(X, dtype=bool)
            np.put_along_axis(pred, top, True, axis=1)
            m["feature_f1_topk"] = float(np.mean([bit_f1(pred[i], X[i] > 0.5) for i in range(X.shape[0])]))
        else:
            cos = (xh * X).sum(1) / np.maximum(np.linalg.norm(xh, axis=1) * np.linalg.norm(X, axis=1), 1e-12)
            prior = truth.x.mean(0)
            base = (X @ prior) / np.maximum(np.linalg.norm(X, axis=1) * np.linalg.norm(prior), 1e-12)
            res.add(
                mean_estimate(
                    "feature_cos", cos, float(base.mean()), chance_method="baseline (cosine to the mean feature)"
                ),
                primary=True,
            )
        yt = y[tm]
        if yt.size:
            guess = out["y"].argmax(1)
            counts = np.bincount(yt, minlength=truth.num_classes)
            m["label_chance"] = float(counts.max() / yt.size)
            res.add(
                proportion_estimate(
                    "label_acc",
                    float((guess == yt).sum()),
                    int(yt.size),
                    m["label_chance"],
                    chance_method="baseline (majority class)",
                )
            )
            if out.get("label_dist") is not None:
                m["label_tv"] = tv_distance(out["label_dist"], counts)
                m["label_tv_prior"] = tv_distance(
                    np.bincount(truth.y[truth.train_mask], minlength=truth.num_classes)
                    if truth.y is not None
                    else np.ones(truth.num_classes),
                    counts,
                )
            if out.get("presence") is not None:
                present = counts > 0
                res.add(
                    proportion_estimate(
                        "label_presence_acc",
                        float((out["presence"] == present).sum()),
                        int(present.size),
                        matching_chance(out["presence"], present),
                    )
                )
        if out.get("support") is not None and truth.binary:
            res.add(auc_estimate("support_auc", out["support"], (X > 0.5).any(0)))
        res.metrics.update(m)
        return res


class AggregateGradientInversion(GradientInversion):
    """The same inversion on the aggregate the observer can read (scored against the victim).

    In plain mode the server reads the aggregate it sends; in ckks/mask the server's downloads
    are ciphertext/masked (not applicable) and only the recipients read it.
    """

    name = "gradient_inversion_aggregate"
    default_observer = SERVER

    def target_vector(self, view, tag, rnd, length, pub):
        """The readable aggregate of ``tag`` at ``rnd``, as both target and total, or a reason string."""
        total = read_aggregate(view, tag, rnd, length)
        if total is None:
            return f"the aggregate of {tag} round {rnd} is not readable by {'+'.join(view.parties)}"
        return total, total


class IsolatedGradientInversion(GradientInversion):
    """A coalition of clients subtracts its own uploads from the aggregate.

    With all other ``K - 1`` clients (or the single other one when ``K = 2``) the victim's weighted update is isolated
    exactly, then inverted.
    """

    name = "gradient_inversion_isolated"
    default_observer = "coalition:others"
    knowledge = GradientInversion.knowledge + ("own_contributions",)
    _known: dict | None = None

    def target_round(self, view, tag):
        """The latest round of ``tag`` the coalition reads in the transcript or holds decrypted."""
        known = (self._known or {}).get("aggregates", {}).get(tag, {})
        rounds = [r for r in (view.latest_round(tag), max(known, default=None)) if r is not None]
        return max(rounds) if rounds else None

    def target_vector(self, view, tag, rnd, length, pub):
        """The victim's update isolated as total - sum of the coalition's own uploads, or a reason string."""
        known = self._known or {}
        total = read_aggregate(view, tag, rnd, length)
        if total is None and rnd in known.get("aggregates", {}).get(tag, {}):
            total = _padded(known["aggregates"][tag][rnd], length)
        if total is None:
            return (
                f"the aggregate of {tag} round {rnd} is ciphertext/masked to the coalition and no "
                "decrypted copy is available"
            )
        members = [party_client(p) for p in view.parties if party_client(p) is not None]
        own = read_uploads(view, tag, rnd, length)
        extra = known.get("uploads", {}).get(tag, {}).get(rnd, {})
        for k in members:
            if k not in own and k in extra:
                own[k] = _padded(extra[k], length)
        missing = [k for k in members if k not in own]
        if missing:
            return f"coalition members {missing} cannot read back their own uploads of {tag} round {rnd}"
        victim = total - np.sum([own[k] for k in members], axis=0)
        return victim, total

    def run(self, view, knowledge):
        """Invert the isolated update; not applicable when the victim is in the coalition."""
        self._known = knowledge.get("own_contributions") or {}
        v = int(self.opts["victim"])
        if client_party(v) in view.parties:
            return self.not_applicable("the victim is in the coalition")
        return super().run(view, knowledge)


def _padded(vec: np.ndarray, P: int) -> np.ndarray:
    """A client's own ``[w v, w]`` (P + 1 entries); an unweighted DP upload (P) gets a zero weight."""
    vec = np.asarray(vec, dtype=np.float64)
    return np.concatenate([vec[:P], [0.0]]) if vec.size == P else vec[: P + 1]
