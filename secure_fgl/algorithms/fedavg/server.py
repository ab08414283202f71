"""FedAvg's server (McMahan et al., AISTATS 2017, Algorithm 1), shared by FedProx and Local."""

from __future__ import annotations

from protocols import DropoutError
from protocols.client_sampling import sample_clients

from ...runtime.dp import privatize_dense
from ...runtime.exchange import plan_dense, run_server_half
from ...runtime.messages import ContributeIns, FitIns, ReceiveIns
from ...runtime.strategy import Strategy
from ..base import model_dp_request, model_spec, train_loss_of


class ModelAveragingStrategy(Strategy):
    """FedAvg's server: deliver the weighted mean of the sampled clients' updates.

    FedAvg's server (McMahan et al. 2017, Algorithm 1): sample clients, let them train, and
    deliver the weighted mean of their updates (tag ``<name>/model``) to every client.  Local
    (``aggregate_models`` false) only trains.  Client sampling is the public PRF of the run
    manifest's seed (:func:`protocols.client_sampling.sample_clients`).
    """

    #: the model mean on the plan's public grid (:func:`~secure_fgl.algorithms.base.model_spec`; FedOMD)
    grid_model_mean = False

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.aggregate_models = cfg.algorithm != "local"
        self.personalized = cfg.algorithm == "local"
        #: clients that missed a model broadcast (not a recipient, or no answer to its download):
        #: the broadcast is the mean update each client adds to its model, so from then on they
        #: train on another model, and (mask, ckks-mp) the clients' check of the broadcasts each
        #: contributor received (:mod:`protocols.broadcast_view`) would refuse every later sum they
        #: join.  In every mode alike they keep training their own model when sampled, but
        #: contribute to and receive no later model sum (kept in checkpoints)
        self.out_of_sync: set[int] = set()

    def sample_clients(self, rnd: int) -> list[int]:
        """Round ``rnd``'s client sample, without the clients out of sync.

        Round ``rnd``'s sample, the public PRF each client recomputes (:mod:`protocols.client_sampling`),
        without the clients out of sync.
        """
        sample = sample_clients(self.cfg.seed, rnd, self.num_clients, self.cfg.client_fraction)
        return [k for k in sample if k not in self.out_of_sync]

    def train_round(self, rnd: int, tag: str | None = None) -> dict:
        """One FedAvg round of the model exchanged as ``tag``.

        Default ``<name>/model``; an algorithm with several models, e.g. fedgcn-gap's encoder, names the one it
        trains.
        """
        self.round = rnd
        sampled = self.sample_clients(rnd)
        ask = self.local_update_request(rnd, tag)
        trainers = sample_clients(self.cfg.seed, rnd, self.num_clients, self.cfg.client_fraction)
        done = self.ask("local_update", {k: ask for k in trainers})  # out of sync too: its own model
        losses = [r.loss for r in done.values() if r.trained and r.loss is not None]
        if self.aggregate_models:
            contributors = [k for k in sampled if k in self.lost or done[k].trained] or sampled
            self.aggregate(rnd, contributors, tag)
        return {**train_loss_of(done, losses), "clients_lost": len(self.lost)}

    def local_update_request(self, rnd: int, tag: str | None) -> FitIns:
        """What each sampled client is told to train in round ``rnd`` (the model ``tag`` names)."""
        return FitIns(rnd, model=tag or None)

    def model_dp_request(self, tag: str):
        """Client-level DP-FedAvg on the model exchange when the run's DP scope covers it."""
        return model_dp_request(self.cfg, self.protocol.dp, tag)

    def aggregate(self, rnd: int, contributors: list[int], tag: str | None = None) -> None:
        """Run the model exchange of round ``rnd``: the weighted mean of the contributors' updates (DP-FedAvg when on).

        Raises:
            DropoutError: every contributor was lost.
        """
        tag = tag or f"{self.name}/model"
        spec = model_spec(
            len(contributors),
            self.num_clients,
            self.cfg.update_bound,
            grid=self.grid_model_mean or self.cfg.model_mean_on_grid,
        )
        dp = self.model_dp_request(tag)
        if dp is not None:  # DP-FedAvg: clipped, unweighted (protocols.dp)
            dp_sum, spec, _ = self.protocol.dp.mean_request(tag, rnd, dp, spec)
        ask = ContributeIns(tag, rnd, dp_clip=None if dp is None else float(dp.clip))
        sent = self.ask("contribute", {k: ask for k in contributors})
        if not sent:
            raise DropoutError(f"every contributor of {tag} was lost: {sorted(self.lost)}", tag=tag, round=rnd)
        length = int(next(iter(sent.values())).length)
        self.model_size = length - (dp is None)
        noisy, noise_std = sorted(sent), 0.0
        if dp is not None:
            noisy, noise_std, spec = privatize_dense(self, tag, rnd, noisy, length, dp_sum, spec)
        recipients = [k for k in self.alive() if k not in self.out_of_sync]
        included = run_server_half(
            self.protocol,
            plan_dense(self.protocol, tag, rnd, noisy, recipients, length, spec, dp_noise_std=noise_std),
        )
        self.note_broadcast(tag, rnd)
        done = ReceiveIns(tag, rnd, length, count=len(included) if dp else None)
        self.tell("receive", {k: done for k in self.alive(recipients)})

    def note_broadcast(self, tag: str, rnd: int) -> None:
        """After a sum under ``tag``: when the schedule marks it a broadcast, :meth:`note_missed_download`.

        In every mode, so that a dropout means the same in each: the modes that bind the broadcasts
        (:data:`~protocols.broadcast_view.VIEW_BINDING_MODES`) could not take the client back, and
        ``plain`` and ``ckks`` do not either.
        """
        if self.protocol.schedule.binds_views(tag):
            self.note_missed_download(tag, rnd)

    def note_missed_download(self, tag: str, rnd: int) -> None:
        """Put the clients that missed the model broadcast out of sync.

        Put the clients without the model broadcast just run (not a recipient, or silent at its
        ``download``: :attr:`protocols.party.ServerHalf.last_undelivered`) out of sync.  In
        ``ckks-mp`` every client key-switches every exchange under the models it received, so one
        such client stops an n-out-of-n run: DropoutError now, before a checkpoint records the round.
        With ``--threshold t`` the key switches run on ``t`` in-sync clients: the server half leaves
        the out-of-sync ones out of its active sets (``stale``).
        """
        missed = sorted((set(range(self.num_clients)) - set(self.alive())) | set(self.protocol.server.last_undelivered))
        server = self.protocol.server
        if missed and self.protocol.mode == "ckks-mp" and server.threshold >= self.num_clients:
            raise DropoutError(
                f"client(s) {missed} got no result of this model broadcast; in ckks-mp every client "
                "key-switches every later exchange bound to the models it received, so the next one would be "
                "refused: rerun with --resume (every client restarts from the last checkpoint, on one model)",
                tag=tag,
                round=rnd,
            )
        self.out_of_sync.update(missed)
        if self.protocol.mode == "ckks-mp":
            server.stale = set(self.out_of_sync)

    def state_dict(self) -> dict:
        """The base checkpoint plus the clients whose model is out of sync."""
        return {**super().state_dict(), "out_of_sync": sorted(self.out_of_sync)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the checkpoint and the out-of-sync clients (ckks-mp: marked stale on the protocol server)."""
        super().load_state_dict(state)
        self.out_of_sync = {int(k) for k in state.get("out_of_sync", ())}
        if self.protocol.mode == "ckks-mp":
            self.protocol.server.stale = set(self.out_of_sync)
