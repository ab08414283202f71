"""One client's runtime: the only object that holds that client's data.

A :class:`ClientRuntime` owns one client's subgraph, labels, model, optimizer and training
randomness (:mod:`secure_fgl.engine.rng`) through its :class:`~.logic.ClientLogic`; it runs
local training and evaluation and answers the server's requests.  Its only interface is
:meth:`handle`: a method name and a request frame in, a response frame out
(:mod:`.wire`), so it can live in the driver (:class:`~.executor.LocalExecutor`) or in a
Ray actor on another machine (:class:`~.ray_executor.RayExecutor`) unchanged.  It never
sees another client's data: the runtime is built from its own frame only.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import torch

from protocols.auth import SigningKey
from protocols.manifest import Manifest
from protocols.registry import backend_class

from ..config import RunConfig
from ..data.federated import ClientSubgraph
from ..engine.checkpoint import from_plain, to_plain
from ..engine.files import write_bytes_atomic
from ..privacy import dp_config
from . import wire
from .facts import GraphFacts, PublicFacts
from .graph_data import graph_client
from .logic import make_logic
from .messages import CheckpointRes, StateRes, decode_request, encode_reply
from .partition import DATA_FIELDS, data_digest, data_fields, own_fields

#: ClientSubgraph fields carried in a client's set-up frame


def client_frame(
    c: ClientSubgraph,
    far_owner: torch.Tensor,
    cfg: RunConfig,
    facts: PublicFacts,
    options: dict,
    party_setup: bytes | None = None,
    owner: torch.Tensor | None = None,
    load_own_data: bool = False,
) -> bytes:
    """The set-up frame of client ``c``.

    Its own data, the owner of the far end of each of its cross edges (a client knows who holds the other end of its
    edges), the run's settings, the public facts and, for a backend in halves, its public setup bytes
    (:class:`protocols.party.PartySetup`). ``owner``: the client owning each of ``c``'s nodes, for a runtime that
    holds several clients' nodes (the centralized reference). ``load_own_data``: the digest of that data instead of
    the data, which the runtime loads on its own machine (:mod:`.partition`).
    """
    setup = {} if party_setup is None else {"party_setup": np.frombuffer(party_setup, dtype=np.uint8)}
    owned = {} if owner is None else {"owner": owner}
    data = data_fields(c, far_owner)
    return wire.pack(
        {
            **({"data_digest": data_digest(data)} if load_own_data else data),
            "client_id": int(c.client_id),
            "config": cfg.to_dict(),
            "facts": facts.to_dict(),
            "options": options,
            **setup,
            **owned,
        }
    )


class ClientRuntime:
    """Client ``client_id`` of the run, built from its set-up frame (:func:`client_frame`)."""

    def __init__(self, frame: bytes, device: str = "cpu"):
        f = wire.unpack(frame)
        self.client_id = int(f["client_id"])
        if "data_digest" in f:  # a pinned client: its data is loaded here (partition.py)
            f.update(own_fields(RunConfig.from_dict(f["config"]), self.client_id, f.pop("data_digest")))
        self.device = torch.device(device)
        if f.get("task") == "graph":  # a graph-classification client (graph_data.py)
            self.data, self.facts = graph_client(f, self.client_id), GraphFacts(**f["facts"])
        else:
            self.data = ClientSubgraph(
                self.client_id, **{k: torch.from_numpy(f[k]).to(self.device) for k in DATA_FIELDS}
            )
            self.far_owner = torch.from_numpy(f["far_owner"])
            self.facts = PublicFacts(**f["facts"])
        #: the client owning each node (only for a runtime holding several clients' nodes)
        self.owner = torch.from_numpy(f["owner"]) if "owner" in f else None
        self.cfg = RunConfig.from_dict(f["config"])
        self.logic = make_logic(self, f["options"])
        #: this client's half of a protocol backend in halves: its keys are generated here
        self.half = None
        if "party_setup" in f:
            self.half = backend_class(self.cfg.mode).client_half(self.client_id, f["party_setup"].tobytes())
            # the manifest and identity key come from the driver directly (protocols/halves.py), never via the server
            self.half.use_manifest(
                Manifest.from_bytes(f["manifest"].tobytes()), SigningKey.from_private_bytes(f["identity"].tobytes())
            )
            self.half.provider = self.logic.table
            self.half.clear_tags = self.logic.clear_tags
            self.half.dp_config = dp_config(self.cfg)
            self._chain_initial_model()

    def handle(self, method: str, request: bytes) -> bytes:
        """Answer one request.

        ``local_update``, ``contribute``, ``privatize``, ``receive``, ``evaluate``, ``save``, ``load``, ``weights``
        or ``attack`` (a request frame in, a response frame out, each a typed message of :mod:`.messages`: a
        malformed one raises :class:`~.messages.MessageError`), or ``half:<stage>`` (the protocol half's stage,
        bundles of signed messages in and out).
        """
        if method.startswith("half:"):  # a protocol stage: signed message bundles in and out
            return self.half.handle(method[5:], request)
        if method == "ping":  # transport overhead measurement (bench)
            return request
        if method == "accepted_keys":  # the key fingerprints this client's half accepted
            return wire.pack({"fingerprints": self.half.registry.fingerprints() if self.half is not None else {}})
        req = decode_request(method, wire.unpack(request))
        if method == "save":
            return wire.pack(encode_reply(method, self._save(Path(req.path))))
        if method == "load":
            return wire.pack(encode_reply(method, self._load(Path(req.path), req.sha256)))
        if method == "weights":  # best_model.pt of a run that writes it
            return wire.pack(encode_reply(method, self._weights()))
        if method == "attack" and not self.cfg.attacks:
            raise PermissionError(
                f"client {self.client_id} hands its state to the attack suite only in a run "
                "started with --attacks (an evaluation, attacks/parties.py)"
            )
        if method == "attack" and req.what == "keys":  # what it hands a coalition it joins
            secrets = self.half.coalition_secrets() if self.half is not None else {}
            return wire.pack(
                encode_reply(method, StateRes({f: np.frombuffer(b, np.uint8) for f, b in secrets.items()}))
            )
        handler = {
            "local_update": self.logic.local_update,
            "contribute": self.logic.contribute,
            "receive": self.logic.receive,
            "evaluate": self.logic.evaluate,
            "privatize": self.logic.privatize,
            "attack": self.logic.attack_state,
        }[method]
        return wire.pack(encode_reply(method, handler(req)))

    def _weights(self) -> StateRes:
        """Its deployed model's parameters, for ``best_model.pt`` (only in a run that writes it)."""
        if not (self.cfg.save_best_model and self.cfg.out):
            raise PermissionError(
                f"client {self.client_id} hands its model weights to the driver only in a run "
                "that writes best_model.pt (--out, --save-best-model)"
            )
        model = getattr(self.logic, "model", None)
        return StateRes({} if model is None else {n: t.detach().cpu() for n, t in model.state_dict().items()})

    def _chain_initial_model(self) -> None:
        """Chain the initial model into the view of the broadcast tag it is trained under.

        Every client builds it from the run's public seed, so honest chains start alike; a client set up with another
        model (another seed, architecture or size) binds another digest into its first contribution
        (:mod:`protocols.broadcast_view`, round ``-1``).
        """
        model, tag = getattr(self.logic, "model", None), getattr(self.logic, "model_tag", None)
        schedule = self.half.schedule
        if model is None or tag is None or schedule is None or not schedule.binds_views(tag):
            return
        params = {i: p.detach().cpu().double().numpy().ravel() for i, p in enumerate(model.state_dict().values())}
        self.half.views.record(tag, -1, params)

    # -- checkpoints: written where the client runs (weights-only plain data)
    #: the key of the protocol half's view chains in a client checkpoint (restored on --resume)
    VIEWS_KEY = "protocol_views"

    def _save(self, path: Path) -> CheckpointRes:
        buf = io.BytesIO()
        state = self.logic.state_dict()
        if self.half is not None:  # the broadcasts it trained on (protocols/broadcast_view.py)
            state = {**state, self.VIEWS_KEY: self.half.views.state_dict()}
        torch.save(to_plain(state), buf)
        data = buf.getvalue()
        write_bytes_atomic(path, data)
        return CheckpointRes(hashlib.sha256(data).hexdigest())

    def _load(self, path: Path, sha256: str | None) -> CheckpointRes:
        if not path.exists():
            raise FileNotFoundError(
                f"client {self.client_id}: checkpoint {path} is missing on this machine; "
                "--resume needs each client's file where that client now runs"
            )
        if hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
            raise ValueError(
                f"client {self.client_id}: {path} is not the file the driver's checkpoint names (digest differs)"
            )
        state = from_plain(torch.load(path, weights_only=True, map_location=self.device))
        views = state.pop(self.VIEWS_KEY, None)
        if self.half is not None and views is not None:
            self.half.views.load_state_dict(views)
        self.logic.load_state_dict(state)
        return CheckpointRes()
