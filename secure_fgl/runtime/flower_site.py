r"""A site's long-lived client process for the Flower deployment.

One organisation runs, next to its Flower SuperNode::

    python -m secure_fgl.runtime.flower_site --socket SITE/site.sock --client 0 \
        --data-root DATA --state-dir SITE/state

It holds the :class:`~.client.ClientRuntime` of its client(s) for the whole run — their data,
model, protocol keys and secrets stay in this one process — and answers the frames each
``ClientApp`` process forwards over the local socket (:mod:`.flower_app`).  The site, not the
aggregator, decides:

* **its data**: before set-up the driver asks each site for the run's public facts and its
  client's data digest (``facts``), which the site computes from the partition it loads from its
  own ``--data-root`` (:mod:`.partition`) and signs with its identity key; the set-up frame then
  carries that digest, never the data, and the runtime refuses a partition that differs.  A site
  started with ``--client-data FILE`` (one per ``--client``: its part exported by ``secure-fgl
  partition export``, :mod:`.client_file`) never reads the dataset: it reports its own client's
  counts (the driver sums them) and starts the runtime from the file, refusing a run whose
  partition settings are not the file's and ``centralized`` (the whole graph in one runtime).
* **what it serves**: the methods of the algorithms' public schedule (:data:`SCHEDULE`) and the
  protocol stages (``half:<stage>``, whose order the protocol half checks).  Attack-simulation
  requests (``attack``: posteriors, own contributions, kept inputs, coalition keys) are refused
  unless the site was started with ``--allow-attack-simulation`` (without it the runtime also
  keeps nothing for attacks), and its deployed model (``weights``, for ``best_model.pt``) unless
  started with ``--allow-model-export``; it announces both in its answer to ``hello``, so the
  driver stops before set-up when the run needs one.
* **where its checkpoint goes**: ``save``/``load`` write and read ``STATE_DIR/client<k>.pt``
  whatever path the request names.
* **whose key it signs with** (``--identity-key KEY --manifest FILE``; one key per
  ``--client``, in the same order): each client half signs with the identity key this site
  made (``secure-fgl keys new``; the private key never leaves this process) and pins the run
  manifest this site verified (``secure-fgl manifest verify``, its comparison code compared out
  of band), read at every set-up; the manifest and key in the set-up frame are ignored.  The
  half refuses a set-up that is not this manifest's run
  (:meth:`protocols.party.Party.use_manifest`), and every public key relayed by the aggregator
  must be signed by an identity key the manifest lists
  (:class:`~protocols.errors.KeySubstitutionError`).  Without ``--identity-key`` the site takes
  the key the aggregator drew (trying it out: no protection against an active aggregator).

A refusal by the protocol (a :class:`protocols.ProtocolError`) goes back as its class name and
message; the driver re-raises it.  Standard library sockets, runtime frames (:mod:`.wire`):
nothing is unpickled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np

from protocols import ProtocolError

from . import local_socket, wire

#: the runtime methods any algorithm's schedule uses (:meth:`.client.ClientRuntime.handle`)
SCHEDULE = frozenset(
    {"local_update", "contribute", "privatize", "receive", "evaluate", "save", "load", "ping", "accepted_keys"}
)


#: what a site's signature over its facts statement is bound to (:meth:`Site.facts`)
FACTS_CONTEXT = b"secure-fgl/site-facts/v1\0"


class SiteRefusal(PermissionError):
    """A request this site does not serve; the message names the site's option that would allow it."""


class Site:
    """The runtimes of this site's clients and the site's policy (module docstring)."""

    def __init__(
        self,
        clients,
        data_root: str | None,
        state_dir: Path,
        allow_attack_simulation: bool = False,
        allow_model_export: bool = False,
        device: str = "cpu",
        identities: dict | None = None,
        manifest: Path | None = None,
        client_data: dict | None = None,
    ):
        """Build the site.

        ``identities``: client -> this site's :class:`~protocols.auth.SigningKey` for it, and
        ``manifest`` the path of the run manifest it verified (both or neither).  ``client_data``:
        client -> the path of its exported data file (every client of the site, or none).
        """
        self.clients = sorted({int(k) for k in clients})
        if (identities is None) != (manifest is None) or (identities and set(identities) != set(self.clients)):
            raise ValueError("a site holding its own identity keys has one per client, and the manifest listing them")
        self.identities, self.manifest = identities, manifest
        self.data_root, self.state_dir, self.device = data_root, Path(state_dir), device
        self.allow_attack_simulation, self.allow_model_export = allow_attack_simulation, allow_model_export
        self.runtimes: dict = {}
        self.files: dict = {}
        if client_data:
            from .client_file import ClientFile, ClientFileError

            if set(client_data) != set(self.clients):
                raise ValueError("a site holding its clients' data files has one per client")
            self.files = {int(k): ClientFile.load(Path(path)) for k, path in client_data.items()}
            for k, file in self.files.items():
                if file.client != k:
                    raise ClientFileError(f"{client_data[k]} holds client {file.client}'s data, not client {k}'s")

    def allowed(self, method: str) -> bool:
        """Whether the site serves ``method``: schedule, protocol stages, and attack or export calls if allowed."""
        return (
            method in SCHEDULE
            or method.startswith("half:")
            or (method == "attack" and self.allow_attack_simulation)
            or (method == "weights" and self.allow_model_export)
        )

    def handle(self, method: str, client: int, frame: bytes) -> bytes:
        """Answer one forwarded request (``hello``, ``start``, ``stop`` or a runtime method)."""
        if method == "hello":  # public: which clients, and which optional requests it serves
            return json.dumps(
                {
                    "clients": self.clients,
                    "serves": {"attack": self.allow_attack_simulation, "weights": self.allow_model_export},
                    "identities": {str(k): key.fingerprint for k, key in (self.identities or {}).items()},
                }
            ).encode()
        if client not in self.clients:
            raise SiteRefusal(f"this site serves clients {self.clients}, not client {client}")
        if method == "facts":  # public, before set-up: what this site's partition tells the strategy
            return self.facts(client, frame)
        if method == "start":
            from .client import ClientRuntime

            self.runtimes[client] = ClientRuntime(self.own_setup(frame), self.device)
            return b""
        if method == "stop":
            self.runtimes.pop(client, None)
            return b""
        if not self.allowed(method):
            option = {
                "attack": " (start the site with --allow-attack-simulation to take part in the attack suite)",
                "weights": " (start the site with --allow-model-export to hand its model to best_model.pt)",
            }.get(method, "")
            raise SiteRefusal(f"this site does not serve {method!r}{option}")
        if client not in self.runtimes:
            raise SiteRefusal(f"client {client} has no runtime on this site yet (no set-up frame)")
        if method in ("save", "load"):
            frame = self.own_checkpoint(client, frame)
        return self.runtimes[client].handle(method, frame)

    def facts(self, client: int, frame: bytes) -> bytes:
        """The public facts of the run's federation and ``client``'s data digest, from this site's own data.

        ``frame`` carries the run's settings; the partition is loaded from this site's ``--data-root``
        (:func:`.partition.own_facts`).  The statement is signed with ``client``'s identity key
        when this site holds one (:data:`FACTS_CONTEXT`).
        """
        from ..config import RunConfig
        from .partition import own_facts

        config = dict(wire.unpack(frame)["config"])
        config["data_root"] = self.data_root
        cfg = RunConfig.from_dict(config)
        if client in self.files:  # its own exported part: its own counts, the dataset is not read
            self.files[client].check_run(cfg)
            facts = self.files[client].statement()
        else:
            facts = own_facts(cfg, client)
        statement = json.dumps({"client": client, **facts}, sort_keys=True)
        reply = {"statement": statement}
        if self.identities:
            key = self.identities[client]
            reply["public_key"] = key.public_bytes.hex()
            reply["signature"] = key.sign(FACTS_CONTEXT + statement.encode()).hex()
        return json.dumps(reply).encode()

    def own_setup(self, frame: bytes) -> bytes:
        """The set-up frame as this site runs it.

        Its own ``--data-root`` for the partition it loads, no state kept for attacks unless it takes part in attack
        simulation, and its own identity key and manifest when it holds them.
        """
        f = wire.unpack(frame)
        if self.identities and self.manifest is not None and "party_setup" in f:
            from protocols.manifest import Manifest

            manifest = Manifest.from_bytes(self.manifest.read_bytes())
            f["manifest"] = np.frombuffer(manifest.to_bytes(), dtype=np.uint8)
            f["identity"] = np.frombuffer(self.identities[int(f["client_id"])].private_bytes(), dtype=np.uint8)
        elif "party_setup" in f and "identity" not in f:
            raise SiteRefusal(
                "the run's manifest lists the sites' own identity keys: start this site with "
                "--identity-key and --manifest"
            )
        config = dict(f["config"])
        config["data_root"] = self.data_root  # None: this machine's $SECURE_FGL_DATA
        if not self.allow_attack_simulation:
            config["attacks"] = []
        f["config"] = config
        if int(f["client_id"]) in self.files:
            f.update(self.own_file_data(int(f["client_id"]), f))
        return wire.pack(f)

    def own_file_data(self, client: int, f: dict) -> dict:
        """The data fields of ``client``'s exported file for set-up frame ``f``, which must name that data.

        :class:`~.client_file.ClientFileError` for a run of another partition, a frame that carries
        data (the whole graph: ``centralized``) or a digest other than the file's.
        """
        from ..config import RunConfig
        from .client_file import ClientFileError

        file = self.files[client]
        file.check_run(RunConfig.from_dict(f["config"]))
        if "data_digest" not in f:
            raise ClientFileError(
                f"client {client}: the set-up frame carries data, not its digest; this site holds only its "
                "own clients' data files (--client-data)"
            )
        if f.pop("data_digest") != file.digest:
            raise ClientFileError(
                f"client {client}: the run planned other data than its data file holds (digest mismatch); give "
                "every site its file from one secure-fgl partition export"
            )
        return file.fields

    def own_checkpoint(self, client: int, frame: bytes) -> bytes:
        """A ``save``/``load`` request pointed at this site's own checkpoint file of ``client``."""
        f = wire.unpack(frame)
        name = Path(str(f["path"])).name  # client<k>[.<slot>].pt: the slot the driver's checkpoint names
        if not name.startswith(f"client{client}.") or not name.endswith(".pt"):
            raise ValueError(f"a checkpoint request for client {client} names the file {name!r}")
        f["path"] = str(local_socket.private_folder(self.state_dir) / name)
        return wire.pack(f)


def answer(site: Site, header: dict, frame: bytes) -> tuple[dict, bytes]:
    """The reply to one forwarded request.

    ``status`` ``ok`` and the response frame, ``refused`` and the :class:`~protocols.ProtocolError` class and
    message, or ``error`` (anything else: the site keeps serving, the driver raises it).
    """
    try:
        return {"status": "ok"}, site.handle(str(header["method"]), int(header["client"]), frame)
    except ProtocolError as exc:
        return {"status": "refused", "error": type(exc).__name__, "message": str(exc)}, b""
    except Exception as exc:  # noqa: BLE001 - reported to the driver
        return {"status": "error", "error": type(exc).__name__, "message": str(exc)}, b""


def serve(site: Site, path: Path) -> None:
    """Answer forwarded requests on the Unix socket ``path``, one connection at a time, until terminated."""
    server = local_socket.listen(path)
    try:
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    local_socket.send(conn, *answer(site, *local_socket.receive(conn)))
                except (OSError, ValueError):  # a peer that went away or sent no message
                    continue
    finally:
        server.close()
        path.unlink(missing_ok=True)


def _exit(*_) -> None:
    raise SystemExit(0)


def main(argv=None) -> None:
    """Command line of a Flower site's client process (docs/deployment.md)."""
    p = argparse.ArgumentParser(
        prog="python -m secure_fgl.runtime.flower_site",
        description="A site's client process for secure-fgl runs over Flower (docs/deployment.md).",
    )
    p.add_argument(
        "--socket",
        required=True,
        type=Path,
        help="Unix socket the site's ClientApp processes reach this process on (give the same path "
        "to the SuperNode as --node-config 'site-socket=\"PATH\"'); its folder is made private",
    )
    p.add_argument(
        "--client",
        type=int,
        action="append",
        required=True,
        help="the client (partition) this site holds; repeat for several",
    )
    p.add_argument(
        "--data-root", default=None, help="this site's dataset folder (default: $SECURE_FGL_DATA, as for every run)"
    )
    p.add_argument(
        "--client-data",
        type=Path,
        action="append",
        default=None,
        metavar="FILE",
        help="a --client's own data file (secure-fgl partition export); one per --client, in the same order: "
        "the site then never reads the dataset",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where this site keeps its checkpoints for --resume (default: next to --socket)",
    )
    p.add_argument(
        "--allow-attack-simulation",
        action="store_true",
        help="serve the attack suite's requests (posteriors, own contributions, kept inputs, keys)",
    )
    p.add_argument(
        "--allow-model-export", action="store_true", help="hand the deployed model to the driver for best_model.pt"
    )
    p.add_argument(
        "--identity-key",
        type=Path,
        action="append",
        default=None,
        help="the identity key of a --client (secure-fgl keys new: DIR or DIR/identity.key); one per "
        "--client, in the same order; with --manifest",
    )
    p.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="the run manifest this site verified (secure-fgl manifest verify --key KEY --as clientK), "
        "read at each run's set-up",
    )
    p.add_argument(
        "--clientappio",
        default=None,
        metavar="HOST:PORT",
        help="run the site's ClientApp tasks in this process (no process per message): the runtime API "
        "address of this site's SuperNode, started with --isolation process --port PORT",
    )
    p.add_argument("--device", default="cpu", help="where this site trains: cpu | cuda | cuda:N | mps (default: cpu)")
    args = p.parse_args(argv)
    if (args.identity_key is None) != (args.manifest is None):
        p.error("--identity-key and --manifest go together")
    identities = None
    if args.identity_key is not None:
        from protocols.auth import SigningKey

        if len(args.identity_key) != len(args.client):
            p.error("give one --identity-key per --client, in the same order")
        paths = [path / "identity.key" if path.is_dir() else path for path in args.identity_key]
        identities = {k: SigningKey.load(path) for k, path in zip(args.client, paths)}
    if args.client_data is not None and len(args.client_data) != len(args.client):
        p.error("give one --client-data per --client, in the same order")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        site = Site(
            args.client,
            args.data_root,
            args.state_dir or args.socket.parent / "state",
            args.allow_attack_simulation,
            args.allow_model_export,
            args.device,
            identities,
            args.manifest,
            None if args.client_data is None else dict(zip(args.client, args.client_data)),
        )
    except ValueError as exc:  # a client data file that is malformed, altered or another client's
        p.error(str(exc))
    signal.signal(signal.SIGTERM, _exit)
    if args.clientappio:
        from .flower_runner import start

        start(args.clientappio)
    serve(site, args.socket)


if __name__ == "__main__":
    main()
