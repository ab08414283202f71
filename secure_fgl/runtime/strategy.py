"""The algorithm's server side: a :class:`Strategy` drives the clients through an executor.

A strategy holds the protocol's server side, the run's public facts and the round state; it
addresses client runtimes only through :meth:`Executor.call <.executor.Executor.call>` and
sees only what comes back.  It is what :func:`secure_fgl.engine.trainer.train` drives
(``setup``, ``train_round``, ``evaluate``, ``state_dict``).

Evaluation: every client reports ``(correct, total)`` per split; each report is a message
in the transcript (tag ``eval/counts``, client -> server, its frame's length in bytes), so
``comm`` counts it.

Protocol: every backend runs as client and server halves (:mod:`protocols.party`); the
client halves run inside the runtimes (:mod:`.exchange`), the strategy holds the server half.

Dropouts (a client whose runtime died or did not answer in time, :mod:`.executor`): lost
clients stay lost for the rest of the run (their process is gone); ``--resume`` restarts every
client from its last checkpoint.  With halves, a client lost during an exchange is the backend's
dropout (mask: recovery or :class:`protocols.DropoutError` naming it; plain, ckks: the sum of the
clients that uploaded; ckks-mp with ``--threshold t``: the sum of the uploaders while t clients remain to
key-switch, else :class:`protocols.DropoutError`; n-out-of-n ckks-mp: every client decrypts, so any lost client
stops the exchange, named) and one lost before it is not a contributor.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from protocols import SERVER, DropoutError, client_party
from protocols.transcript import READABLE_KINDS, Message

from ..algorithms.base import accuracy_summary
from . import wire
from .client import client_frame
from .exchange import halves_in_runtimes
from .messages import CheckpointIns, EvaluateIns, RuntimeMessage, WeightsIns, decode_reply, encode_request
from .partition import far_owners
from .placement import parse_client_resources

EVAL_TAG = "eval/counts"


class Strategy:
    """Base: the round loop's interface over an executor (module docstring)."""

    name = "base"
    personalized = False

    def __init__(self, executor, protocol, cfg, facts, options: dict):
        self.executor, self.protocol, self.cfg, self.facts, self.opts = executor, protocol, cfg, facts, options
        self.name = cfg.algorithm
        self.round = 0
        #: client -> why it was lost (its runtime died or timed out); never asked again
        self.lost: dict[int, str] = {}
        if not halves_in_runtimes(protocol):
            raise ValueError(
                "a strategy drives the protocol halves in the client runtimes: build its protocol with "
                "secure_fgl.runtime.build.make_runtime_protocol"
            )
        protocol.link.on_lost = self.lose
        #: parameters of the exchanged model (the privacy section's noise-to-signal ratio)
        self.model_size: int | None = None

    @classmethod
    def client_frames(cls, fed, cfg, facts, options: dict, party_setup: bytes | None) -> dict[int, bytes]:
        """The set-up frame of each runtime the strategy addresses.

        One per client, its own data only; a client pinned to a Ray node (``--ray-client-resources``) loads its data
        there (:mod:`.partition`) and gets the digest of it instead.
        """
        pinned = parse_client_resources(cfg.ray_client_resources, cfg.clients) if cfg.ray_client_resources else {}
        return {
            c.client_id: client_frame(
                c, far_owners(fed, c), cfg, facts, options, party_setup, load_own_data=c.client_id in pinned
            )
            for c in fed.clients
        }

    @property
    def num_clients(self) -> int:
        """Number of clients of the run."""
        return self.facts.num_clients

    @property
    def hosts(self) -> list[int]:
        """The runtimes the strategy addresses (:meth:`client_frames`): one per client."""
        return list(range(self.num_clients))

    def host_of(self, client: int) -> int:
        """The runtime holding client ``client``'s nodes (the attack suite asks it for that client's view)."""
        return client

    def alive(self, clients: Iterable[int] | None = None) -> list[int]:
        """The given clients (default: every host) that have not been lost."""
        clients = self.hosts if clients is None else clients
        return [k for k in clients if k not in self.lost]

    # ------------------------------------------------------------------ messaging
    def ask(
        self,
        method: str,
        requests: Mapping[int, RuntimeMessage],
        *,
        record: tuple[str, str] | None = None,
    ) -> dict[int, Any]:
        """Send each client its request and return the answers.

        Send each client its typed request (:mod:`.messages`); returns the typed replies of those
        that answered (the others join :attr:`lost`).  ``record=(tag, kind)`` puts every response in
        the transcript as a client -> server message of its frame's length; a readable kind (plain,
        metadata) keeps what the server read, the response's fields, as its payload.
        """
        frames = {k: wire.pack(encode_request(method, r)) for k, r in requests.items() if k not in self.lost}
        tags = {getattr(r, "tag", None) for r in requests.values()} - {None}
        responses, lost = self.executor.call(method, frames, label=tags.pop() if len(tags) == 1 else "")
        self.lose(lost, method)
        unpacked = {k: wire.unpack(v) for k, v in responses.items()}
        if record is not None:
            for k, frame in responses.items():
                self.record(
                    record[0],
                    client_party(k),
                    SERVER,
                    record[1],
                    len(frame),
                    payload=unpacked[k] if record[1] in READABLE_KINDS else None,
                )
        return {k: decode_reply(method, f) for k, f in unpacked.items()}

    def lose(self, lost: dict[int, str], method: str) -> None:
        """Record clients that did not answer ``method`` (a warning names them)."""
        if lost:
            self.lost.update(lost)
            warnings.warn(
                f"client(s) {sorted(lost)} lost in {method} of round {self.round}: "
                + "; ".join(sorted(set(lost.values()))),
                RuntimeWarning,
                stacklevel=3,
            )

    def tell(
        self, method: str, requests: Mapping[int, RuntimeMessage], *, record: tuple[str, str] | None = None
    ) -> None:
        """Like :meth:`ask` for requests whose answer is empty.

        ``record`` records the requests (server -> client) instead.
        """
        if record is not None:
            for k, r in requests.items():
                if k not in self.lost:
                    nbytes = len(wire.pack(encode_request(method, r)))
                    self.record(record[0], SERVER, client_party(k), record[1], nbytes)
        self.ask(method, requests)

    def record(
        self,
        tag: str,
        sender: str,
        receiver: str,
        kind: str,
        nbytes: int,
        note: str = "",
        relay: str = "",
        payload=None,
    ) -> None:
        """Record a message the strategy exchanged outside the protocol (e.g. evaluation counts) in the transcript."""
        self.protocol.transcript.record(
            Message(
                self.round,
                tag,
                sender,
                receiver,
                kind,
                (nbytes,),
                nbytes,
                self.protocol.mode,
                "",
                payload,
                note=note,
                relay=relay,
            )
        )

    def check_lost(self, clients: Iterable[int], what: str) -> None:
        """DropoutError naming the lost ones among ``clients`` (an exchange that cannot lose any)."""
        gone = sorted(k for k in clients if k in self.lost)
        if gone:
            raise DropoutError(
                f"client(s) {gone} were lost ({'; '.join(sorted({self.lost[k] for k in gone}))}) "
                f"before {what}; nothing was aggregated. Restart them and run again with --resume",
                round=self.round,
            )

    # ------------------------------------------------------------------ round loop
    def setup(self) -> None:
        """One-off exchanges before training (default: none)."""

    def train_round(self, rnd: int) -> dict:
        """Run round ``rnd``: local training and the algorithm's exchanges.

        Args:
            rnd: The round number.

        Returns:
            The round's metrics (at least ``train_loss`` and ``clients_lost``).
        """
        raise NotImplementedError

    def evaluate(self) -> dict:
        """Node-weighted and per-client accuracies from the clients' counts.

        Node-weighted and per-client accuracies (:func:`~secure_fgl.algorithms.base.accuracy_summary`),
        from the clients' counts.
        """
        counts = self.ask("evaluate", {k: EvaluateIns() for k in self.alive()}, record=(EVAL_TAG, "plain"))
        return accuracy_summary({k: r.counts for k, r in counts.items()})

    def final_metrics(self) -> dict:
        """Metrics reported once at the end (executor description, lost clients; algorithms add theirs)."""
        return {"executor": self.executor.describe(), "clients_lost": {str(k): v for k, v in self.lost.items()}}

    def deployed_weights(self) -> dict:
        """The content of ``best_model.pt``.

        ``best_model.pt``'s content (:mod:`secure_fgl.engine.hooks`): each live client's deployed
        model as ``models.<k>.<parameter>``, asked of its runtime (the run's output: not a protocol
        message, counted in the executor's stats only).
        """
        answers = self.ask("weights", {k: WeightsIns() for k in self.alive()})
        return {
            f"models.{k}.{name}": torch.as_tensor(t) for k in sorted(answers) for name, t in answers[k].state.items()
        }

    # ------------------------------------------------------------------ checkpoints
    #: which of the two client checkpoint files the next save writes: the slots alternate, so a crash
    #: between the clients' writes and the driver's checkpoint leaves the files that checkpoint names
    _slot = 0

    def _client_file(self, k: int, slot: int | None) -> str:
        name = f"client{k}.pt" if slot is None else f"client{k}.{slot}.pt"  # None: a checkpoint without slots
        return str(Path(self.cfg.out) / "clients" / name)

    def state_dict(self) -> dict:
        """Have each client checkpoint itself; keep their digests and the slot.

        Each client writes its own checkpoint where it runs (into the slot the last checkpoint
        does not name); the driver keeps their digests and the slot.
        """
        slot, self._slot = self._slot, 1 - self._slot
        saved = self.ask("save", {k: CheckpointIns(self._client_file(k, slot)) for k in self.alive()})
        return {"clients": {str(k): v.sha256 for k, v in saved.items()}, "slot": slot, "server": self.server_state()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from a checkpoint: each client loads its own file (digest checked), then the server state is restored.

        Raises:
            DropoutError: the checkpoint has no state for some client, or a client was lost during the resume.
        """
        slot = state.get("slot")
        self._slot = 0 if slot is None else 1 - int(slot)
        digests = {int(k): v for k, v in state["clients"].items()}
        missing = sorted(set(self.hosts) - set(digests))
        if missing:
            raise DropoutError(
                f"the checkpoint has no state for client(s) {missing} (lost before it was written); start a new run",
                round=self.round,
            )
        self.ask("load", {k: CheckpointIns(self._client_file(k, slot), d) for k, d in digests.items()})
        self.check_lost(self.hosts, "the resume")
        self.load_server_state(state["server"])

    def server_state(self) -> dict:
        """The strategy's own checkpoint state (default: none)."""
        return {}

    def load_server_state(self, state: dict) -> None:
        """Restore the state written by :meth:`server_state`."""
        pass
