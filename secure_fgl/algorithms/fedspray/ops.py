"""FedSpray: personalized GNNs regularised by a global feature-structure encoder.

The class-wise structure proxies are aligned on the server.

Fu, Chen, Ding, Li — "Federated Graph Learning with Structure Proxy Alignment", KDD 2024
(sec. 4, Algorithm 1, eq. 5-15).

Client ``k`` holds a personalized GNN ``f(theta_k)`` (GCN, SGC or GraphSAGE, 2 layers, hidden 64)
and a copy of the global encoder ``g(w) = (g_e, g_p, g_q)`` and proxies ``S`` (``C x d_s``);
see :mod:`secure_fgl.models.fedspray_encoder`.  One round (Algorithm 1):

Phase 1 (lines 2-11): with the global ``w_{r-1}, S_{r-1}`` compute ``e = g_e(x)``, ``q = g_q(e)``,
  node proxies ``s_i`` (``S[y_i]`` for a training node, ``<q_i, S>`` otherwise) and the soft
  targets ``p = g_p(e + s)``; train the GNN for ``E`` epochs on
  ``L_G = CE(y, y_hat)|_train + lambda1 * KL(p || y_hat)|_all nodes``  (eq. 5-7).
Phase 2 (lines 13-23): with ``y_hat`` of the trained GNN, train the local encoder copy and the
  per-node proxies ``s_i`` of the training nodes for ``E`` epochs on
  ``L_F = CE(y, q)|_train + lambda2 * KL(y_hat || p)|_train``  (eq. 11-13), then set the local
  class proxy ``S^(k)_j`` = mean of ``s_i`` over the training nodes of class ``j``.
Server: ``w_r = sum_k N_k/N w_r^(k)`` (eq. 14) through :meth:`Protocol.weighted_mean` (tag
  ``fedspray/encoder``; clients send ``w_k - w_{r-1}``, weights ``N_k / |V|`` — node counts over the
  public graph size — hidden from the server in secure modes), and
  ``s_{j,r} = sum_k a_j^(k)/a_j s_{j,r}^(k)`` (eq. 15) through :meth:`Protocol.classwise_mean`
  (tag ``fedspray/proxies``; ``a_j^(k)`` = share of class ``j`` among client ``k``'s training
  nodes).  A class a client lacks is sent as a zero row with zero weight: in ``ckks``/``mask`` the
  server learns neither the ratios nor which classes are absent; in ``plain`` it reads both —
  exactly the reference code's leak, kept so the attack suite can measure it.  A class no client
  holds keeps its previous proxy.

What is uploaded per round: the encoder update (``g_e``, ``g_p``, ``g_q``) and ``[a^(k) * S^(k), a^(k)]``.
The personalized GNNs never leave the clients.

Hyper-parameters (sec. 5.1.3) are the defaults of :class:`FedSprayOptions`: Adam, lr 0.003 for the
GNN and the encoder, 0.02 for proxies, ``lambda1 = 5``, ``lambda2 = 1``, ``d_s = 64``, ``E = 5``
(``phase_epochs``; FedSpray ignores ``--local-epochs``).  The paper's 300 rounds is ``--rounds 300``
(a run setting, not an option).

``ablate_proxy=True`` is Table 3's ``S = 0``: proxies fixed at zero, neither trained nor exchanged.
Where the reference code (``xbfu/FedSpray``) differs from the paper the defaults follow the paper;
the differences and the measured behaviour on PubMed: docs/fedspray.md.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols import DPRequest, Protocol, ValueSpec
from protocols.batch import batch_spec
from protocols.precision import MeanPrecision

from ...engine import rng
from ...models import build_model
from ...models.fedspray_encoder import FeatureStructureEncoder, initial_proxies, node_proxies
from ...validation import ConfigError
from ..base import PARAM_BOUND, model_spec
from ..options import FedSprayOptions

BACKBONES = ("gcn", "sgc", "sage")
#: codec spec of the proxy alignment (eq. 15): entries within ``PARAM_BOUND``, class totals planned as 1
PROXY_SPEC = MeanPrecision(value_bound=PARAM_BOUND).spec()
#: with DP on, aligned proxy entries are clamped to +-this (post-processing; the noisy class-weight
#: total in eq. 15's denominator can come out near zero)
DP_PROXY_BOUND = 10.0


def classwise_weighted_mean(
    values: dict[int, np.ndarray], weights: dict[int, np.ndarray], previous: np.ndarray | None = None
) -> np.ndarray:
    """Plaintext eq. 15: the class-wise weighted mean of the proxies.

    Plaintext eq. 15: ``S_j = sum_k w_kj S_kj / sum_k w_kj``; rows with zero total weight keep
    ``previous`` (zeros without it).  The reference for the protocol's secure result.
    """
    ks = list(values)
    num = sum(np.asarray(weights[k], dtype=np.float64)[:, None] * np.asarray(values[k], dtype=np.float64) for k in ks)
    den = sum(np.asarray(weights[k], dtype=np.float64) for k in ks)
    out = np.zeros_like(num) if previous is None else np.array(previous, dtype=np.float64)
    present = den > 1e-9
    out[present] = num[present] / den[present, None]
    return out


def class_weights(counts: np.ndarray, weighting: str = "ratio", graph_size: int | None = None) -> np.ndarray:
    """Eq. 15 weights from a client's training class counts.

    Ratios ``a^(k)`` (``'ratio'``) or counts divided by the public graph size (``'count'``; keeps ``|w * S|``
    bounded).
    """
    counts = np.asarray(counts, dtype=np.float64)
    if weighting == "count":
        return counts / float(graph_size if graph_size else max(counts.sum(), 1.0))
    return counts / max(counts.sum(), 1.0)


def declare_dp_exchanges(protocol: Protocol, cfg, name: str, opts: FedSprayOptions) -> None:
    """With DP on, declare both exchanges (encoder, proxies) so each gets a share of the budget."""
    dp = getattr(protocol, "dp", None)
    if dp is not None and cfg.dp_epsilon and getattr(dp.config, "budget_shares", None) is None:
        dp.declare(f"{name}/encoder", *([] if opts.ablate_proxy else [f"{name}/proxies"]))


def round_spec(
    encoder_spec: ValueSpec, opts: FedSprayOptions, dp: DPRequest | None, num_contributors: int, num_clients: int
) -> ValueSpec | None:
    """The spec of one upload per client carrying both exchanges of a round.

    The upload has tag ``<name>/batch``: ``[a^(k) * S^(k), a^(k), w_k dw_k, w_k]``
    (:mod:`protocols.batch`). ``None`` where they stay separate: DP on (each release keeps its own
    clip), ``S = 0``, ``batch_exchanges`` off, or specs that cannot share an encoding. With the encoder mean on its
    public grid (``ckks`` by default, ``--grid-model-mean``) the proxies take the grid the same rule gives their own
    bound (:func:`~secure_fgl.algorithms.base.model_spec` at ``PARAM_BOUND``; class totals planned as 1, as
    ``PROXY_SPEC``): with the default ``--update-bound`` that is the encoder's grid, and every mode then aligns the
    proxies to the same bits too.
    """
    if dp is not None or opts.ablate_proxy or not opts.batch_exchanges:
        return None
    proxies = (
        PROXY_SPEC
        if encoder_spec.grid_bits is None
        else model_spec(num_contributors, num_clients, PARAM_BOUND, grid=True)
    )
    return batch_spec([encoder_spec, proxies])


def dp_request(cfg) -> DPRequest | None:
    """The client-level request of both exchanges (``--dp-clip``, one release per round), or ``None``."""
    return DPRequest(clip=cfg.dp_clip, releases=cfg.rounds) if cfg.dp_epsilon else None


def keep_absent(mean: np.ndarray, present: np.ndarray, previous: torch.Tensor) -> torch.Tensor:
    """Eq. 15's result as the new ``S``: rows of classes with zero total weight keep ``previous``."""
    present_t = torch.as_tensor(present, device=previous.device)
    return torch.where(
        present_t[:, None], torch.as_tensor(mean, dtype=previous.dtype, device=previous.device), previous
    )


def client_gnn(opts: FedSprayOptions, num_features: int, num_classes: int, seed: int, k: int) -> torch.nn.Module:
    """Client k's personalized GNN, initialised from its own seed.

    The seed is ``(seed, k)``: the same wherever the client runs, whatever the other clients draw.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([int(seed), int(k)]).generate_state(1)[0]))
        return build_model(
            opts.backbone, num_features, opts.gnn_hidden, num_classes, num_layers=2, dropout=opts.gnn_dropout
        )


class SprayClient:
    """One client's FedSpray state and its two local phases.

    One client's FedSpray state -- its GNN ``f(theta_k)``, its working copy of the encoder, the
    proxies ``s_i`` of its training nodes, their optimizers -- and its two local phases.
    """

    def __init__(
        self,
        c,
        k: int,
        opts: FedSprayOptions,
        num_features: int,
        num_classes: int,
        encoder: FeatureStructureEncoder,
        seed: int,
    ):
        self.c, self.k, self.opts, self.num_classes, self.seed = c, k, opts, num_classes, seed
        device = c.x.device
        self.gnn = client_gnn(opts, num_features, num_classes, seed, k).to(device)
        self.gnn_opt = torch.optim.Adam(self.gnn.parameters(), lr=opts.model_lr)
        self.encoder = encoder
        self.encoder_opt = torch.optim.Adam(encoder.parameters(), lr=opts.model_lr)
        self.node_proxy = torch.zeros(int(c.train_mask.sum()), opts.proxy_dim, device=device, requires_grad=True)
        self.proxy_opt = torch.optim.Adam([self.node_proxy], lr=opts.proxy_lr)
        self.class_counts = torch.bincount(c.y[c.train_mask], minlength=num_classes).double().cpu().numpy()

    @torch.no_grad()
    def soft_targets(self, encoder: FeatureStructureEncoder, proxies: torch.Tensor):
        """``(p, q, s)`` of the client's nodes under ``encoder`` and the global ``S``.

        Algorithm 1 lines 2-5: probabilities ``p = softmax(g_p(e + s))``, ``q = softmax(g_q(e))`` and node proxies
        ``s``.
        """
        c = self.c
        encoder.eval()
        e = encoder.embedding(c.x)
        q_logits = encoder.project(e)
        s = node_proxies(q_logits, proxies, c.y, c.train_mask)
        p = F.softmax(encoder.classify(e, s), dim=-1)
        return p, F.softmax(q_logits, dim=-1), s

    def proxy_weights(self, graph_size: int) -> np.ndarray:
        """Eq. 15 weights: class ratios ``a^(k)`` (or counts over the public graph size)."""
        return class_weights(self.class_counts, self.opts.proxy_weighting, graph_size)

    def encoder_weight(self, graph_size: int) -> float:
        """Eq. 14 weight ``N_k`` (local node count), divided by the public graph size."""
        return self.c.num_nodes / float(graph_size)

    def train_gnn(self, p: torch.Tensor, q: torch.Tensor, rnd: int) -> float:
        """Phase 1: train the personalized GNN.

        Phase 1: ``E`` epochs of ``CE + lambda1 * KL(p || y_hat)`` (eq. 5-7); dropout keyed per
        client and epoch (:func:`~secure_fgl.engine.rng.client_generator`).
        """
        c, gnn, opt, o = self.c, self.gnn, self.gnn_opt, self.opts
        kd_mask = (
            torch.ones_like(c.train_mask)
            if o.kd_threshold <= 0
            else (c.train_mask | (q.max(-1).values > o.kd_threshold))
        )
        log_p = torch.log(p.clamp_min(1e-12))
        gnn.train()
        loss = torch.zeros(())
        for epoch in range(o.phase_epochs):
            opt.zero_grad()
            with rng.using(rng.client_generator(self.seed, rnd, self.k, epoch)):
                logits = gnn(c.x, c.edge_index)
            ce = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
            kd = F.kl_div(F.log_softmax(logits[kd_mask], -1), log_p[kd_mask], reduction="batchmean", log_target=True)
            loss = ce + o.lambda1 * kd
            loss.backward()
            opt.step()
        return float(loss.detach())

    def train_encoder(self, s_train: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Phase 2: train the encoder copy and the per-node proxies.

        Phase 2: ``E`` epochs of ``CE(y, q) + lambda2 * KL(y_hat || p)`` on the training nodes
        (eq. 11-13), updating the encoder copy and the per-node proxies (lines 13-22); returns the
        loss and the local class proxies ``S^(k)`` (line 23).
        """
        c, o, gnn, enc, enc_opt = self.c, self.opts, self.gnn, self.encoder, self.encoder_opt
        gnn.eval()
        with torch.no_grad():
            log_y_hat = F.log_softmax(gnn(c.x, c.edge_index)[c.train_mask], -1)
        x, y = c.x[c.train_mask], c.y[c.train_mask]
        s = self.node_proxy
        with torch.no_grad():
            s.copy_(s_train)
        enc.train()
        loss = torch.zeros(())
        for _ in range(o.phase_epochs):
            enc_opt.zero_grad()
            if not o.ablate_proxy:
                self.proxy_opt.zero_grad()
            e = enc.embedding(x)
            ce = F.cross_entropy(enc.project(e), y)
            p_logits = enc.classify(e, s if not o.ablate_proxy else s.detach())
            kd = F.kl_div(F.log_softmax(p_logits, -1), log_y_hat, reduction="batchmean", log_target=True)
            loss = ce + o.lambda2 * kd
            loss.backward()
            enc_opt.step()
            if not o.ablate_proxy:
                self.proxy_opt.step()
        with torch.no_grad():
            sums = torch.zeros(self.num_classes, o.proxy_dim, device=s.device).index_add_(0, y, s.detach())
            counts = torch.bincount(y, minlength=self.num_classes).clamp(min=1).to(s.dtype)
            local = sums / counts[:, None]  # absent classes: zero rows
        return float(loss.detach()), local

    def local_update(
        self, global_encoder: torch.Tensor, proxies: torch.Tensor, rnd: int
    ) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Algorithm 1 ``LocalUpdate``: ``(loss, encoder update w_k - w, local proxies S^(k))``."""
        vector_to_parameters(global_encoder.clone(), self.encoder.parameters())
        p, q, s = self.soft_targets(self.encoder, proxies)
        loss_g = self.train_gnn(p, q, rnd)
        loss_f, local = self.train_encoder(s[self.c.train_mask])
        update = parameters_to_vector(self.encoder.parameters()).detach() - global_encoder
        return loss_g + loss_f, update, local

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        """Logits of the client's GNN in eval mode."""
        self.gnn.eval()
        return self.gnn(self.c.x, self.c.edge_index)

    def state_dict(self) -> dict:
        """GNN, the three optimizers and the node proxies."""
        return {
            "gnn": self.gnn.state_dict(),
            "gnn_opt": self.gnn_opt.state_dict(),
            "encoder_opt": self.encoder_opt.state_dict(),
            "proxy_opt": self.proxy_opt.state_dict(),
            "node_proxy": self.node_proxy.detach().cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        self.gnn.load_state_dict(state["gnn"])
        self.gnn_opt.load_state_dict(state["gnn_opt"])
        self.encoder_opt.load_state_dict(state["encoder_opt"])
        with torch.no_grad():
            self.node_proxy.copy_(state["node_proxy"].to(self.node_proxy.device))
        self.proxy_opt.load_state_dict(state["proxy_opt"])


def new_encoder(opts: FedSprayOptions, num_features: int, num_classes: int, seed: int) -> FeatureStructureEncoder:
    """The global encoder's initialisation ``w_0`` (every client builds the same one from the run seed)."""
    torch.manual_seed(seed)
    return FeatureStructureEncoder(num_features, opts.proxy_dim, num_classes)


def first_proxies(opts: FedSprayOptions, num_classes: int) -> torch.Tensor:
    """``S_0`` (zeros with ``ablate_proxy``)."""
    return (
        torch.zeros(num_classes, opts.proxy_dim) if opts.ablate_proxy else initial_proxies(num_classes, opts.proxy_dim)
    )


def check_options(o: FedSprayOptions) -> None:
    """Check FedSpray's options.

    Raises:
        ConfigError: an unknown backbone or proxy weighting, or a size below 1.
    """
    if o.backbone.lower() not in BACKBONES:
        raise ConfigError(
            f"--backbone {o.backbone!r} is not one FedSpray supports; choose one of {', '.join(BACKBONES)}"
        )
    if o.proxy_weighting not in ("ratio", "count"):
        raise ConfigError(f"--proxy-weighting must be 'ratio' or 'count', got {o.proxy_weighting!r}")
    if o.phase_epochs < 1:
        raise ConfigError(f"--phase-epochs must be >= 1, got {o.phase_epochs}")
    if o.proxy_dim < 1 or o.gnn_hidden < 1:
        raise ConfigError("--proxy-dim and --gnn-hidden must be >= 1")
