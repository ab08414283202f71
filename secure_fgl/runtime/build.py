"""Build a run's client runtimes, executor and server strategy from a partitioned graph.

The driver partitions the data (as :func:`secure_fgl.data.load.load_federation` does for every
run) and hands client ``k`` one set-up frame with its own data only
(:func:`~.client.client_frame`); from then on the strategy sees :class:`~.facts.PublicFacts`
and what the clients send.  On Flower the driver loads no data: the sites describe the
federation and each loads its own partition (:class:`.flower_executor.SiteFederation`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from protocols import Transcript, make_protocol

from ..algorithms import get_spec
from ..config import RunConfig
from ..data.graph_classification import FederatedGraphDataset
from ..data.load import load_federation
from ..manifest import schedule_option, site_keys
from ..preflight import preflight
from ..privacy import dp_config
from . import wire
from .dropouts import DropoutSchedule, SimulatedDropouts, parse_dropouts
from .exchange import RuntimeLink, halves_in_runtimes
from .executor import Executor, LocalExecutor
from .facts import GraphFacts, PublicFacts
from .graph_data import graph_client_frame
from .placement import client_resources
from .strategy import Strategy


def make_executor(cfg, device: str = "cpu") -> Executor:
    """The executor named by ``--executor``: ``local``, ``ray`` or ``flower``.

    ``--executor local``, ``ray`` (:mod:`.ray_executor`, needs ``pip install -e ".[ray]"``) or
    ``flower`` (:mod:`.flower_executor`, needs ``pip install -e ".[flower]"``).
    """
    if cfg.executor == "ray":
        from .ray_executor import RayExecutor

        executor = RayExecutor(
            address=cfg.ray_address,
            num_cpus=cfg.ray_num_cpus,
            workers=cfg.ray_workers,
            round_timeout=cfg.round_timeout,
            client_resources=client_resources(cfg),
        )
    elif cfg.executor == "flower":  # sites behind Flower SuperNodes (docs/deployment.md)
        from .flower_executor import FlowerExecutor, needs_of

        executor = FlowerExecutor(round_timeout=cfg.round_timeout, needs=needs_of(cfg))
    else:
        executor = LocalExecutor(device)
    if cfg.simulate_dropouts:  # --simulate-dropouts (.dropouts)
        rules = parse_dropouts(cfg.simulate_dropouts, cfg.clients, cfg.mode, cfg.rounds)
        return SimulatedDropouts(executor, DropoutSchedule(rules))
    return executor


def sites_hold_data(cfg) -> bool:
    """Whether the driver of ``cfg`` loads no data: its sites describe the federation (``--executor flower``).

    With ``--attacks`` too (the attack suite's ground truth is then what the opted-in sites report,
    :mod:`attacks.reported`); not for ``centralized`` (its one runtime gets the whole graph, which no site holds).
    """
    return cfg.executor == "flower" and cfg.algorithm != "centralized"


def run_transcript(cfg: RunConfig) -> Transcript:
    """The transcript of a run.

    Message metadata always (``comm``, the privacy section, the side file); payloads (of each tag's latest round)
    only when ``--attacks`` will read them. Without attacks nothing reads a payload, and keeping them would hold a
    one-time exchange -- FedGCN's neighbour sums, every upload and download of it -- in memory for the rest of the
    run.
    """
    return Transcript(keep_payloads="latest" if cfg.attacks else "none")


def make_run_protocol(cfg: RunConfig, num_clients: int, transcript: Transcript | None = None, link=None, **options):
    """The run's protocol object from ``cfg``.

    The run's protocol object (:func:`protocols.make_protocol`) from ``cfg``; ``link``: where its
    client halves live; ``options``: backend settings no flag carries (a bench's CKKS parameters).
    """
    extra = {"fixed_point_bits": cfg.fixed_point_bits} if cfg.fixed_point_bits is not None else {}
    if cfg.ckks_real_slots:
        extra["exact_fields"] = False
    if link is not None:  # a backend in halves, its client halves behind ``link``
        extra["link"] = link
    if cfg.mode != "plain":  # the public collusion bound every client half checks plans against
        extra.update(max_colluders=cfg.max_colluders, min_contributors=cfg.min_contributors)
    extra.update(schedule_option(cfg))  # the manifest's hash of the public schedule
    if cfg.threshold is not None:  # ckks-mp t-out-of-n
        extra["threshold"] = cfg.threshold
    if cfg.keyswitch_batch_mb is not None:  # ckks-mp's bound on one key-switch call (bytes of shares)
        extra["keyswitch_batch_bytes"] = cfg.keyswitch_batch_mb << 20
    extra.update(options)
    extra.update(site_keys(cfg))  # the sites' manifest and the server's key (--manifest), if given
    return make_protocol(cfg.mode, num_clients, transcript=transcript, dp=dp_config(cfg), seed=cfg.seed, **extra)


def make_runtime_protocol(cfg, num_clients: int, executor: Executor, transcript=None, **options):
    """The run's protocol with the executor as its link.

    The link is a :class:`~.exchange.RuntimeLink`: its client halves live in the runtimes.
    """
    return make_run_protocol(cfg, num_clients, transcript, link=RuntimeLink(executor), **options)


def make_strategy(cfg, fed, protocol, options, executor: Executor) -> Strategy:
    """Start one runtime per client on ``executor`` and return the algorithm's server strategy."""
    opts = dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options or {})
    setup = protocol.setup.to_bytes() if halves_in_runtimes(protocol) else None
    cls = get_spec(cfg.algorithm).strategy_class()
    if hasattr(fed, "digests"):  # the sites hold the data (.flower_executor.SiteFederation): digests, no data
        facts, frames = fed.facts, fed.client_frames(cfg, opts, setup)
    elif isinstance(fed, FederatedGraphDataset):  # graph classification: each client its own graphs
        facts = GraphFacts.of(fed)
        frames = {c.client_id: graph_client_frame(c, cfg, facts, opts, setup) for c in fed.clients}
    else:  # node classification: the strategy's frames
        facts = PublicFacts.of(fed)
        frames = cls.client_frames(fed, cfg, facts, opts, setup)
    if setup is not None:  # the manifest and each identity key, driver -> runtime directly
        frames = {
            k: wire.pack(
                {
                    **wire.unpack(f),
                    **{n: np.frombuffer(b, dtype=np.uint8) for n, b in protocol.client_identity(k).items()},
                }
            )
            for k, f in frames.items()
        }
    executor.start(frames)
    strategy = cls(executor, protocol, cfg, facts, opts)
    if isinstance(executor, SimulatedDropouts):  # simulated dropouts follow the strategy's round
        executor.clock = lambda: strategy.round
    return strategy


@dataclasses.dataclass
class StartedRun:
    """A run's parties, built but not trained.

    Made by :func:`start_run`: the server ``strategy``, its ``protocol`` (server half and transcript), the ``executor``
    holding the client runtimes and the partitioned data ``fed`` (the evaluator's ground truth).
    """

    strategy: Strategy
    protocol: object
    executor: Executor
    fed: object

    @property
    def runtimes(self) -> dict:
        """Client id -> its :class:`~.client.ClientRuntime` (``--executor local`` only)."""
        return self.executor.runtimes

    def logic(self, k: int):
        """Client ``k``'s :class:`~.logic.ClientLogic` (``--executor local`` only)."""
        return self.executor.runtimes[k].logic

    def train(self, rounds: int | None = None, *, setup: bool = True) -> list[dict]:
        """Set up, then train ``rounds`` rounds.

        ``setup()`` (unless ``setup`` is false), then ``rounds`` rounds (default: the config's);
        returns each round's metrics.
        """
        if setup:
            self.strategy.setup()
        n = self.strategy.cfg.rounds if rounds is None else rounds
        return [self.strategy.train_round(r) for r in range(n)]


def start_run(
    cfg: RunConfig,
    fed=None,
    executor: Executor | None = None,
    transcript: Transcript | None = None,
    protocol_options: dict | None = None,
) -> StartedRun:
    """Check ``cfg``, load its data and start one runtime per client.

    Check ``cfg`` (:func:`~secure_fgl.preflight.preflight`), load its data unless ``fed`` is
    given, start one runtime per client on ``executor`` (default: :func:`make_executor`'s) and
    build the server strategy: what :func:`secure_fgl.experiment.run_experiment` trains, for a
    script or a test that drives the rounds itself (``transcript``: default
    :func:`run_transcript`'s; ``protocol_options``: :func:`make_run_protocol`'s ``options``).
    Shut the executor down when done.
    """
    options = preflight(cfg, check_data=fed is None)
    fed = load_federation(cfg) if fed is None else fed
    executor = make_executor(cfg) if executor is None else executor
    transcript = transcript or run_transcript(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor, transcript, **(protocol_options or {}))
    return StartedRun(make_strategy(cfg, fed, protocol, options, executor), protocol, executor, fed)
