r"""Record-level DP-SGD: per-record gradients from Opacus, noise from the CSPRNG.

Abadi et al., *Deep Learning with Differential Privacy*, CCS 2016, Alg. 1, full batch or with
Poisson sampling.
For a model whose output on node ``v`` depends only on ``v``'s own input row (an MLP on
``x_v``, or GAP's head on ``[H_0, ..., H_K]_v``), a training node is one record; for a graph
classifier a training graph is (:meth:`DPSGD.clipped_sum_graphs`, each mini-batch a step over
disjoint graphs, so an epoch is one release).  Each full-batch step of client ``k`` over its
training nodes ``T_k``:

.. math::  g = \frac{1}{|T_k|}\Big(\sum_{i \in T_k} g_i \min\big(1, C / \|g_i\|\big)
           + N(0, z^2 C^2 I)\Big)

``g_i`` the gradient of node ``i``'s loss (:class:`opacus.GradSampleModule`), ``C`` the clip
(``--dp-clip``), ``z`` the tag's noise multiplier.  Adding or removing one training node
changes the clipped sum by at most ``C`` (L2 sensitivity C, add/remove-one); ``|T_k|`` is
treated as public, like Opacus' expected batch size.

Poisson sampling (``sample_rate`` q < 1, ``--dp-sample-rate``): each step sums over the nodes
``B_t = {i in T_k : u_i < q}``, ``u_i`` uniform from the client's OS-keyed keystream (secret,
fresh each step), and divides by the expected batch ``q |T_k|`` (public), as Opacus does.  The
step is a subsampled Gaussian mechanism, accounted at rate q in Renyi DP (Mironov, Talwar &
Zhang 2019; Opacus' RDP accountant): the amplification by subsampling.

The run's :class:`protocols.dp.DPEngine` counts each step in the run's one accountant
(:meth:`~protocols.dp.DPEngine.local_release`): clients hold disjoint nodes, so step ``t`` of all
clients is one Gaussian release (parallel composition), ``rounds x local_epochs`` releases in all,
composed with the run's other releases.  The noise is drawn from an OS-keyed
:class:`protocols.csprng.SecureRandom`, never the run seed: each client's own keystream on its
runtime (:mod:`secure_fgl.algorithms.gap.client`, with the std the driver's engine sizes).  The models a
client uploads are post-processing of its noisy gradients.

Noise placement: each client adds all of ``N(0, z^2 C^2)`` to each step (local), unless a round
is a single plain SGD step inside a secure model mean (:func:`noise_contributors`): then the
mean is one central DP-SGD step on all clients' nodes, and each client adds only its share
``z C / sqrt(K - dropouts - colluders)`` (distributed, as the secure exchanges do).

What it protects: a training node's features and label as a training example of this model.
Not that node's features inside its neighbours' aggregates (only edge-level noise covers those),
and not validation/test labels used to evaluate or select models.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from protocols import DPRequest

from .engine import rng

#: what a DP-SGD step asks for its noise: the number of gradient entries -> N(0, sigma^2) noise
NoiseSource = Callable[[int], np.ndarray]


class DPSGD:
    """Full-batch DP-SGD steps with per-node clipping to ``clip``.

    The noise of each step comes from the caller (:meth:`train`).
    """

    def __init__(self, clip: float, sample_rate: float = 1.0):
        from opacus import GradSampleModule

        self.clip, self.sample_rate = float(clip), float(sample_rate)
        self._wrap = GradSampleModule
        self._modules: dict[int, nn.Module] = {}

    def per_sample_module(self, model: nn.Module) -> nn.Module:
        """The model wrapped once in :class:`opacus.GradSampleModule` (shares its parameters)."""
        if id(model) not in self._modules:
            self._modules[id(model)] = self._wrap(model, loss_reduction="sum")
        return self._modules[id(model)]

    def _clip_and_sum(self, params: list[nn.Parameter], per_record: torch.Tensor) -> list[torch.Tensor]:
        """``sum_i g_i min(1, C / ||g_i||)`` of the rows of ``per_record``, split per parameter."""
        scale = (self.clip / per_record.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
        clipped = (per_record * scale[:, None]).sum(0)
        out, at = [], 0
        for p in params:
            out.append(clipped[at : at + p.numel()].view_as(p))
            at += p.numel()
        return out

    def clipped_sum(
        self, model: nn.Module, x: torch.Tensor, edge_index: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``(sum_i clip(g_i), loss)``: per-node gradients of the masked nodes (Opacus), each clipped to C.

        An edge-free model (``edge_index`` empty: an MLP, whose output on a node reads that node's row alone) runs on
        the masked rows only.
        """
        if edge_index is not None and edge_index.numel() == 0:
            x, y = x[mask], y[mask]
            mask = torch.ones(x.size(0), dtype=torch.bool, device=x.device)
        gsm = self.per_sample_module(model)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad_sample = None
            p.grad = None
        loss = F.cross_entropy(gsm(x, edge_index)[mask], y[mask], reduction="sum")
        with warnings.catch_warnings():  # opacus' hooks on a model whose inputs need no gradient
            warnings.filterwarnings("ignore", message=r".*Full backward hook is firing.*")
            loss.backward()
        loss = loss.detach()
        per_node = torch.cat([p.grad_sample[mask].reshape(int(mask.sum()), -1) for p in params], dim=1)
        for p in params:
            p.grad_sample = None
        return self._clip_and_sum(params, per_node), loss / max(1, int(mask.sum()))

    def clipped_sum_graphs(self, model: nn.Module, batch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The sum of per-graph clipped gradients over a mini-batch, and the loss.

        ``(sum_g clip(g_g), loss)`` over the graphs of a mini-batch (a
        :class:`torch_geometric.data.Batch`), a graph being one record; every trainable parameter
        must belong to an ``nn.Linear`` (GCFL's GIN).  A ``Linear`` with input rows ``z_i`` and
        output gradients ``d_i`` has weight gradient ``sum_i d_i z_i^T``; graph ``g``'s loss depends
        only on its own rows, so its gradient is that sum over its rows -- its nodes before the
        readout, itself after it -- computed for all graphs by one batched matmul over the
        zero-padded rows (:func:`per_graph_linear_grads`).  Opacus' per-row gradients would
        materialise one ``out x in`` matrix per node (12x a plain step on PROTEINS-sized batches).
        """
        outputs: dict[nn.Linear, tuple[torch.Tensor, torch.Tensor]] = {}

        def keep(module, inputs, output):
            outputs[module] = (inputs[0].detach(), output)

        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        hooks = [m.register_forward_hook(keep) for m in linears]
        try:
            loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch), batch.y, reduction="sum")
        finally:
            for h in hooks:
                h.remove()
        used = [m for m in linears if m in outputs]
        grads_out = torch.autograd.grad(loss, [outputs[m][1] for m in used])
        per_graph: dict[int, torch.Tensor] = {}
        for m, d in zip(used, grads_out):
            weight, bias = per_graph_linear_grads(outputs[m][0], d, batch.batch, int(batch.num_graphs))
            per_graph[id(m.weight)] = weight
            if m.bias is not None:
                per_graph[id(m.bias)] = bias
        params = [p for p in model.parameters() if p.requires_grad]
        missing = [tuple(p.shape) for p in params if id(p) not in per_graph]
        if missing:
            raise ValueError(
                f"per-graph DP-SGD needs every trainable parameter in an nn.Linear used by the "
                f"forward pass; parameters of shape {missing} are not"
            )
        graphs = int(batch.num_graphs)
        per_record = torch.cat([per_graph[id(p)].reshape(graphs, -1) for p in params], dim=1)
        return self._clip_and_sum(params, per_record), loss.detach() / max(1, graphs)

    @staticmethod
    def apply_noisy(model: nn.Module, grads: list[torch.Tensor], noise: NoiseSource, records: int) -> None:
        """Set every trainable parameter's gradient to the noisy clipped mean.

        ``p.grad = (clipped sum + N(0, sigma^2 I)) / records`` for every trainable parameter
        (``records``: the public batch size).
        """
        size = sum(g.numel() for g in grads)
        draw = torch.as_tensor(noise(size), dtype=grads[0].dtype, device=grads[0].device)
        at = 0
        for p, g in zip((p for p in model.parameters() if p.requires_grad), grads):
            p.grad = (g + draw[at : at + g.numel()].view_as(g)) / max(1, records)
            at += g.numel()

    def step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        noise: NoiseSource,
        x: torch.Tensor,
        edge_index: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        uniform: Callable[[int], np.ndarray] | None = None,
    ) -> float:
        """One DP-SGD step of one client over the nodes of ``mask``.

        With ``sample_rate`` < 1, over the Poisson sample of them :meth:`poisson_sample` draws from ``uniform``.
        Returns the mean loss.
        """
        records = int(mask.sum())
        if self.sample_rate < 1:
            if uniform is None:
                raise ValueError("Poisson-sampled DP-SGD needs the client's uniform draws (its keystream)")
            mask, records = self.poisson_sample(mask, uniform), self.sample_rate * records
        if bool(mask.any()):
            grads, loss = self.clipped_sum(model, x, edge_index, y, mask)
        else:  # nobody sampled: the step is the noise alone
            grads, loss = [torch.zeros_like(p) for p in model.parameters() if p.requires_grad], torch.tensor(0.0)
        self.apply_noisy(model, grads, noise, records)
        optimizer.step()
        return float(loss)

    def poisson_sample(self, mask: torch.Tensor, uniform: Callable[[int], np.ndarray]) -> torch.Tensor:
        """The Poisson sample of the nodes of ``mask`` at ``sample_rate``.

        The nodes of ``mask`` each kept with probability ``sample_rate``, independently
        (``uniform(n)``: n draws from U[0, 1), the client's secret keystream).
        """
        u = torch.as_tensor(uniform(int(mask.numel())), device=mask.device)
        return mask & (u < self.sample_rate)

    def train(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        edge_index: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        *,
        seed: int,
        rnd: int,
        client: int,
        noises: list[NoiseSource],
        uniform: Callable[[int], np.ndarray] | None = None,
    ) -> float:
        """Client ``client``'s local update of round ``rnd``.

        One DP-SGD step per noise source (``local_epochs`` of them), step ``s`` under the client's generator
        :func:`~secure_fgl.engine.rng.client_generator` ``(seed, rnd, client, s)``; ``uniform``: the client's secret
        U[0, 1) draws for Poisson sampling.
        """
        model.train()
        loss = 0.0
        for s, noise in enumerate(noises):
            optimizer.zero_grad()
            with rng.using(rng.client_generator(seed, rnd, client, s)):
                loss = self.step(model, optimizer, noise, x, edge_index, y, mask, uniform)
        return loss


def per_graph_linear_grads(
    z: torch.Tensor, d: torch.Tensor, batch: torch.Tensor, graphs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-graph ``(weight, bias)`` gradients of a ``Linear`` layer.

    Per-graph ``(weight, bias)`` gradients ``([G, out, in], [G, out])`` of a ``Linear`` whose input
    rows are ``z`` and output gradients ``d``: rows of a node-level layer belong to the graph
    ``batch`` names (summed per graph), rows of a graph-level layer are the graphs.
    """
    from torch_geometric.utils import to_dense_batch

    if z.shape[0] == graphs and batch.numel() != graphs:  # after the readout: one row a graph
        return d[:, :, None] * z[:, None, :], d
    zd, _ = to_dense_batch(z, batch, batch_size=graphs)  # [G, N_max, in], zero padding
    dd, _ = to_dense_batch(d, batch, batch_size=graphs)  # [G, N_max, out]
    bias = torch.zeros((graphs, d.shape[1]), dtype=d.dtype, device=d.device).index_add_(0, batch, d)
    return torch.bmm(dd.transpose(1, 2), zd), bias


def noise_contributors(cfg, placement: str, num_trainers: int, model_mean_has_dp: bool) -> int:
    r"""How many clients' noise shares one DP-SGD step's release carries.

    ``num_trainers`` (the clients with training nodes) when the step leaves them only inside the protocol's secure
    model mean, else 1 (each client adds all of ``sigma``).

    The secure sum carries the step when a round is exactly one plain SGD step
    (``--local-epochs 1 --optimizer sgd``, no momentum), every client takes part
    (``--client-fraction 1``), the model mean is the unnoised FedAvg mean with weights
    ``n_k / N`` and the placement is distributed (ckks, mask).  Then

    .. math::  \sum_k \frac{n_k}{N}\Big(w - \frac{\eta}{n_k}(G_k + \xi_k)\Big)
               = w - \frac{\eta}{N}\Big(\sum_k G_k + \sum_k \xi_k\Big),

    one DP-SGD step on the union of the clients' training nodes (``G_k`` a client's clipped
    sum) whose noise is the sum of the shares ``xi_k``; only this mean leaves the secure sum.
    With several local steps or Adam's per-client moments a client's upload is a non-linear
    function of its own share, which then has to carry all of ``sigma``.
    """
    one_sgd_step = cfg.local_epochs == 1 and cfg.optimizer == "sgd" and not cfg.momentum
    secure_sum = placement == "distributed" and cfg.client_fraction == 1 and not model_mean_has_dp
    return int(num_trainers) if one_sgd_step and secure_sum else 1


def stage_request(clip: float, rounds: int, local_epochs: int) -> DPRequest:
    """The DP request of one training stage: sensitivity C per step, ``rounds x local_epochs`` releases."""
    return DPRequest(clip=float(clip), sensitivity=float(clip), releases=int(rounds) * int(local_epochs))
