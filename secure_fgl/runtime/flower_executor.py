"""Client runtimes at the sites of a Flower federation (``--executor flower``; ``pip install -e ".[flower]"``).

The driver stays the secure-fgl process that runs the strategy (results, transcript, attacks
unchanged); the clients are the sites' long-lived client processes (:mod:`.flower_site`), one
per organisation, each behind its own Flower SuperNode.  Between them::

    driver --local socket--> ServerApp --Flower Message (gRPC/HTTP, TLS)--> SuperNode
           --> ClientApp --local socket--> site process (ClientRuntime)

:class:`FlowerExecutor` writes a Flower app folder whose components are :mod:`.flower_app`,
submits it with ``flwr run`` to the default SuperLink connection of the Flower configuration
(``$FLWR_HOME/config.toml``), and waits for the ``ServerApp`` to connect back to it over a
private Unix socket.  Every :meth:`call` then goes to the ServerApp as one message of the
request frames, and comes back as the answering clients' response frames: the bytes the
``ClientLink`` seam and the runtimes produce, unchanged.  What Flower adds around them (its
message objects: metadata, records; without the HTTP/TLS framing) is counted separately
(:meth:`describe`, ``result.json["runtime"]["flower"]``).

The driver **loads no data**: the sites describe the federation (:meth:`FlowerExecutor.federation`:
the public facts the strategy needs and each client's data digest, signed by the site's identity
key), and a set-up frame carries the client's data digest instead of its data; the site loads its
own partition (:class:`SiteFederation`, :mod:`.partition`).  Only for ``centralized`` (one runtime
holding the whole graph) does the driver load the data.  With ``--attacks``, an ``attack`` request
goes only to the sites that opted in to attack simulation (:data:`SOFT`): they report their
clients' parts, from which the attack suite assembles its ground truth (:mod:`attacks.reported`);
a request for a client whose site did not opt in fails before anything is sent, and the attacks
that need its data or state are reported not applicable.
A client whose site gives no answer within ``--round-timeout`` (its SuperNode or site process
died, or is cut off) comes back as lost: the strategy makes it a protocol dropout.  A
:class:`~protocols.ProtocolError` a site raised is re-raised (the first in client order, after
every addressed site has answered), as by the other executors; any other error a site
reports is raised as :class:`SiteError`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocols import ProtocolError

from ..config import ConfigError
from . import local_socket, wire
from .executor import Executor
from .facts import GraphFacts, PublicFacts

#: how long the driver waits for the ServerApp to connect, and for the sites to be found (seconds)
START_TIMEOUT = 120.0


class SiteError(RuntimeError):
    """A site's runtime raised an error that is not a protocol refusal (or refused a request)."""


def _flwr() -> str:
    try:
        import flwr  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError(
            "--executor flower needs Flower: pip install -e '.[flower]' (or use --executor local)"
        ) from None
    here = Path(sys.executable).parent / "flwr"
    return str(here) if here.exists() else (shutil.which("flwr") or "flwr")


def flower_env() -> dict:
    """The environment Flower's commands run in: no background update check."""
    return {**os.environ, "FLWR_DISABLE_UPDATE_CHECK": "1"}


APP_TOML = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "secure-fgl-run"
version = "1.0.0"
description = "A secure-fgl run: relays of runtime frames (secure_fgl.runtime.flower_app)"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "secure-fgl"

[tool.flwr.app.components]
serverapp = "secure_fgl.runtime.flower_app:serverapp"
clientapp = "secure_fgl.runtime.flower_app:clientapp"

[tool.flwr.app.config]
relay-socket = ""
"""


def _refusal(name: str, message: str, client: int) -> Exception:
    """The :class:`~protocols.ProtocolError` subclass named ``name``, with ``message``.

    The :class:`~protocols.ProtocolError` subclass named ``name`` (or the base class) with
    ``message``, naming the refusing client; only ProtocolError classes are ever built.
    """
    classes, stack = {}, [ProtocolError]
    while stack:
        cls = stack.pop()
        classes[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    exc = classes.get(name, ProtocolError)(message)
    exc.refusing_client = client
    return exc


#: requests a site serves only when it opts in, and the driver's setting that makes them
OPTIONAL = {
    "attack": ("--allow-attack-simulation", "run without --attacks"),
    "weights": ("--allow-model-export", "run with --save-best-model false"),
}
#: optional requests a run does without where a site refuses them: ``--attacks`` then runs the
#: attacks on the aggregator's view, and reports those needing such a site's state not applicable
SOFT = frozenset({"attack"})


def needs_of(cfg) -> tuple[str, ...]:
    """The optional requests a run with settings ``cfg`` makes.

    ``weights`` when it writes ``best_model.pt``, ``attack`` with ``--attacks``.
    """
    return (("weights",) if cfg.save_best_model and cfg.out else ()) + (("attack",) if cfg.attacks else ())


def check_sites_serve(needs, serves: dict[int, dict]) -> None:
    """``ConfigError`` naming both fixes if a site does not serve an optional request the run needs."""
    for need in needs:
        refusing = sorted(k for k, s in serves.items() if not s.get(need))
        if refusing:
            flag, fix = OPTIONAL[need]
            raise ConfigError(
                f"--executor flower: the site(s) of client(s) {refusing} do not serve {need!r} "
                f"requests: {fix}, or start those sites with {flag}"
            )


def check_attack_simulation(requests, attack_sites) -> None:
    """Refuse an ``attack`` request to a site that takes no part in attack simulations.

    :class:`SiteError`, without sending anything, if an ``attack`` request addresses a client
    whose site takes no part in attack simulation (the attack needs that client's state).
    """
    refusing = sorted(set(map(int, requests)) - set(attack_sites))
    if refusing:
        raise SiteError(
            f"this attack needs the state of client(s) {refusing}, whose site takes no part in attack "
            f"simulation (start it with {OPTIONAL['attack'][0]} to include it)"
        )


def check_site_keys(frames: Mapping[int, bytes], identities: dict[int, str | None]) -> None:
    """Check the run's manifest against the sites' own identity keys.

    ``ConfigError`` naming the fix, before any set-up frame is sent, if the run's manifest and
    the sites' own identity keys (their public fingerprints, from ``hello``) do not agree: a run
    that draws the keys itself while a site holds its own, the reverse, or a manifest that lists
    another key for a site.  (The sites' own check is :meth:`protocols.party.Party.use_manifest`;
    this one only names the fix early.)
    """
    from protocols.manifest import Manifest
    from protocols.transcript import client_party

    for k in sorted(frames):
        f = wire.unpack(frames[k])
        if "manifest" not in f:  # a backend without a manifest
            continue
        own = identities.get(k)
        if own is not None and "identity" in f:
            raise ConfigError(
                f"--executor flower: the site of client {k} holds its own identity key: build the "
                "manifest from the sites' keys (secure-fgl manifest new) and run with --manifest and --identity-key"
            )
        if own is None and "identity" not in f:
            raise ConfigError(
                f"--executor flower: the site of client {k} has no identity key of its own: start it "
                "with --identity-key and --manifest (or run without --manifest)"
            )
        listed = Manifest.from_bytes(f["manifest"].tobytes()).parties.get(client_party(k))
        if own is not None and listed != own:
            raise ConfigError(
                f"--executor flower: the manifest lists {listed[:16]}... for client {k}, its site "
                f"holds {own[:16]}...: rebuild the manifest with the sites' fingerprints"
            )


def strip_data(frame: bytes) -> bytes:
    """A set-up frame with its data fields replaced by their digest.

    A set-up frame with its data fields (a node client's subgraph, a graph client's graphs)
    replaced by their digest (:func:`.partition.data_digest`): the site loads its partition
    itself and checks it.  The frame of a runtime holding several clients' nodes (the
    ``centralized`` reference) is not a partition and goes as it is.
    """
    from .client import DATA_FIELDS
    from .graph_data import SPLITS
    from .partition import data_digest

    f = wire.unpack(frame)
    if "data_digest" in f or "owner" in f:  # a runtime holding several clients' nodes (centralized) keeps its data
        return frame
    if f.get("task") == "graph":
        names = [name for name in f if name.split("/")[0] in SPLITS]
    elif "x" in f:
        names = [*DATA_FIELDS, "far_owner"]
    else:
        return frame
    data = {name: f.pop(name) for name in names}
    return wire.pack({"data_digest": data_digest(data), **f})


@dataclass(frozen=True)
class SiteFederation:
    """The federation as its sites describe it: the public facts and each client's data digest, no data.

    What the driver of a Flower run holds instead of the partitioned data (:meth:`FlowerExecutor.federation`).
    """

    facts: PublicFacts | GraphFacts
    digests: dict[int, str]

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return self.facts.num_clients

    @property
    def num_classes(self) -> int | None:
        """Number of classes (node classification; ``None`` for graph classification, where each client has its own)."""
        return self.facts.num_classes if isinstance(self.facts, PublicFacts) else None

    def client_frames(self, cfg, options: dict, party_setup: bytes | None) -> dict[int, bytes]:
        """Each client's set-up frame: its data digest instead of its data, which its site loads itself.

        The frame :func:`strip_data` makes of the frame built from the data (:func:`.client.client_frame`,
        :func:`.graph_data.graph_client_frame`).
        """
        setup = {} if party_setup is None else {"party_setup": np.frombuffer(party_setup, dtype=np.uint8)}
        frames = {}
        for k, digest in sorted(self.digests.items()):
            graph = (
                {
                    "task": "graph",
                    "dataset": self.facts.datasets[k],
                    "num_features": int(self.facts.num_features[k]),
                    "num_classes": int(self.facts.num_classes[k]),
                }
                if isinstance(self.facts, GraphFacts)
                else {}
            )
            frames[k] = wire.pack(
                {
                    "data_digest": digest,
                    **graph,
                    "client_id": k,
                    "config": cfg.to_dict(),
                    "facts": self.facts.to_dict(),
                    "options": options,
                    **setup,
                }
            )
        return frames


def site_federation(replies: Mapping[int, bytes], identities: Mapping[int, str | None]) -> SiteFederation:
    """The federation from the sites' ``facts`` replies.

    ``ConfigError`` naming the fix if a reply is not signed by the identity key its site announced
    (``identities``: client -> fingerprint, ``None`` for a site without its own key) or if the sites'
    facts differ (their data or secure-fgl versions differ).  Sites that hold only their own clients'
    data files report their own counts, which are summed (:func:`.client_file.summed_facts`).
    """
    from protocols.auth import key_fingerprint

    from .flower_site import FACTS_CONTEXT

    statements = {}
    for k, raw in sorted(replies.items()):
        reply = json.loads(raw)
        if identities.get(k) is not None:
            public = bytes.fromhex(reply.get("public_key", ""))
            try:
                if key_fingerprint(public) != identities[k]:
                    raise InvalidSignature
                Ed25519PublicKey.from_public_bytes(public).verify(
                    bytes.fromhex(reply.get("signature", "")), FACTS_CONTEXT + reply["statement"].encode()
                )
            except (InvalidSignature, ValueError):
                raise ConfigError(
                    f"--executor flower: client {k}'s facts are not signed by the identity key its site announced"
                ) from None
        statements[k] = json.loads(reply["statement"])
        if statements[k]["client"] != k:
            raise ConfigError(f"--executor flower: client {k}'s site answered for client {statements[k]['client']}")
    digests = {k: s["digest"] for k, s in statements.items()}
    if any("sums" in s for s in statements.values()):  # sites holding only their own parts (.client_file)
        from .client_file import summed_facts

        return SiteFederation(PublicFacts(**summed_facts(statements)), digests)
    described = {json.dumps([s["task"], s["facts"]], sort_keys=True) for s in statements.values()}
    if len(described) != 1:
        raise ConfigError(
            "--executor flower: the sites describe different federations (public facts differ): give every "
            "site the same dataset files and the same secure_fgl version"
        )
    first = next(iter(statements.values()))
    facts = (PublicFacts if first["task"] == "node" else GraphFacts)(**first["facts"])
    return SiteFederation(facts, digests)


class FlowerExecutor(Executor):
    """Client runtimes at the sites of a Flower federation (module docstring)."""

    name = "flower"

    def __init__(self, round_timeout: float = 600.0, start_timeout: float = START_TIMEOUT, needs: tuple = ()):
        """Build the executor.

        ``needs``: the optional requests the run will make (:data:`OPTIONAL`), checked
        against what each site serves before any set-up frame is sent.
        """
        super().__init__()
        self.needs = tuple(needs)
        flwr = _flwr()
        self.round_timeout, self.start_timeout = float(round_timeout), float(start_timeout)
        self.folder = Path(tempfile.mkdtemp(prefix="secure-fgl-flower-"))
        self.flower = {
            "messages": 0,
            "message_bytes_down": 0,
            "message_bytes_up": 0,
            "frame_bytes_down": 0,
            "frame_bytes_up": 0,
        }
        self.sock = self.run_id = None
        self.clients: list[int] = []
        self.nodes: dict[int, int] = {}  # client -> the node id of its site's SuperNode
        self.attack_sites: set[int] = set()  # clients whose site serves attack-simulation requests
        self.sites: dict[int, dict] = {}  # client -> what its site announced (hello), once found
        try:
            listener = local_socket.listen(self.folder / "relay" / "relay.sock")
            app = self.folder / "app"
            app.mkdir()
            (app / "pyproject.toml").write_text(APP_TOML)
            out = subprocess.run(
                [flwr, "run", str(app), "--format", "json", "--run-config", f"relay-socket='{listener.getsockname()}'"],
                env=flower_env(),
                capture_output=True,
                text=True,
                timeout=self.start_timeout,
                check=False,
            )
            if out.returncode != 0:
                raise ConfigError(
                    "--executor flower: `flwr run` failed (is a SuperLink running, and the default "
                    f"connection of $FLWR_HOME/config.toml pointing at it?): "
                    f"{(out.stdout + out.stderr).strip()[-600:]}"
                )
            self.run_id = _run_id(out.stdout)
            listener.settimeout(self.start_timeout)
            try:
                self.sock, _ = listener.accept()
            except TimeoutError:
                raise ConfigError(
                    f"--executor flower: the ServerApp of run {self.run_id} did not connect within "
                    f"{self.start_timeout:g} s (see `flwr log {self.run_id}`)"
                ) from None
            finally:
                listener.close()
            self.sock.settimeout(None)
        except BaseException:
            self.shutdown()
            raise

    def _relay(self, header: dict, payload: bytes = b"") -> tuple[dict, bytes]:
        local_socket.send(self.sock, header, payload)
        return local_socket.receive(self.sock)

    def start(self, frames: Mapping[int, bytes]) -> None:
        """Find the site of every client, then hand each its set-up frame without its data.

        On
        any failure the Flower run is stopped before the error is raised.
        """
        try:
            self._start(frames)
        except BaseException:
            self.shutdown()
            raise

    def find_sites(self, clients: list[int]) -> dict[int, dict]:
        """Find the site of every client (once); client -> what its site announced (``hello``)."""
        if self.sites:
            return self.sites
        found, _ = self._relay({"op": "sites", "clients": clients, "timeout": self.start_timeout})
        if found["claimed_twice"]:
            raise ConfigError(
                f"--executor flower: client(s) {found['claimed_twice']} are served by more than one "
                "site; give each site its own --client"
            )
        missing = sorted(set(clients) - {int(k) for k in found["nodes"]})
        if missing:
            raise ConfigError(
                f"--executor flower: no SuperNode's site serves client(s) {missing} (start each site "
                "with python -m secure_fgl.runtime.flower_site --client K and its SuperNode with "
                "--node-config 'site-socket=\"...\"')"
            )
        self.nodes = {int(k): n for k, n in found["nodes"].items() if int(k) in clients}
        sites = {int(k): v for k, v in found["sites"].items() if int(k) in clients}
        check_sites_serve([n for n in self.needs if n not in SOFT], {k: v["serves"] for k, v in sites.items()})
        self.attack_sites = {k for k, v in sites.items() if v["serves"].get("attack")}
        if "attack" in self.needs and len(self.attack_sites) < len(sites):
            warnings.warn(
                f"--executor flower: the sites of client(s) {sorted(set(sites) - self.attack_sites)} take no "
                "part in attack simulation (started without --allow-attack-simulation): --attacks runs "
                "the attacks on the aggregator's view; those needing these clients' state are reported "
                "not applicable",
                RuntimeWarning,
                stacklevel=3,
            )
        self.sites = sites
        return sites

    def federation(self, cfg) -> SiteFederation:
        """The run's federation as its sites describe it: the driver loads no data.

        Finds the site of each of ``cfg.clients`` clients and asks each for the public facts and its
        client's data digest, from the partition it loads from its own data (:func:`site_federation`).
        On any failure the Flower run is stopped before the error is raised.
        """
        try:
            sites = self.find_sites(list(range(cfg.clients)))
            request = wire.pack({"config": cfg.to_dict()})
            replies, lost = self._call("facts", {k: request for k in sorted(sites)})
            if lost:
                raise ConfigError(f"--executor flower: sites of clients {sorted(lost)} gave no facts: {lost}")
            return site_federation(replies, {k: v["identity"] for k, v in sites.items()})
        except BaseException:
            self.shutdown()
            raise

    def _start(self, frames: Mapping[int, bytes]) -> None:
        self.clients = sorted(frames)
        sites = self.find_sites(self.clients)
        check_site_keys(frames, {k: v["identity"] for k, v in sites.items() if k in frames})
        _, lost = self._call("start", {k: strip_data(f) for k, f in frames.items()})
        if lost:
            raise ConfigError(f"--executor flower: sites of clients {sorted(lost)} did not start: {lost}")

    def _call(self, method, requests):
        if method == "attack":
            check_attack_simulation(requests, self.attack_sites)
        order = sorted(requests)
        answer, payload = self._relay(
            {
                "op": "call",
                "method": method,
                "timeout": self.round_timeout,
                "sizes": [[k, len(requests[k])] for k in order],
            },
            b"".join(bytes(requests[k]) for k in order),
        )
        responses, failures, offset = {}, [], 0
        for k, n, status in answer["answers"]:
            body, offset = payload[offset : offset + n], offset + n
            if status.get("status") == "ok":
                responses[int(k)] = body
            elif status.get("status") == "refused":
                failures.append((int(k), _refusal(status.get("error", ""), status.get("message", ""), int(k))))
            else:
                failures.append(
                    (int(k), SiteError(f"client {k}'s site: {status.get('error')}: {status.get('message')}"))
                )
        f = self.flower
        f["messages"] += answer["flower_messages"]
        f["message_bytes_down"] += answer["flower_bytes_down"]
        f["message_bytes_up"] += answer["flower_bytes_up"]
        f["frame_bytes_down"] += sum(len(requests[k]) for k in order)
        f["frame_bytes_up"] += len(payload)
        if failures:  # every site has answered: the first in client order
            raise min(failures, key=lambda x: x[0])[1]
        return responses, {int(k): why for k, why in answer["lost"].items()}

    def describe(self) -> dict:
        """Run id, number of sites and Flower's message and frame byte counts (with the framing overhead)."""
        f = self.flower
        return {
            "executor": self.name,
            "run_id": self.run_id,
            "sites": len(set(self.nodes.values())),
            "flower": {
                **f,
                "framing_overhead_bytes": f["message_bytes_down"]
                + f["message_bytes_up"]
                - f["frame_bytes_down"]
                - f["frame_bytes_up"],
            },
        }

    def shutdown(self) -> None:
        """Let the sites drop their runtimes, stop the ServerApp (the Flower run ends) and remove the app folder."""
        if self.sock is not None:
            try:
                if self.clients:
                    self._call("stop", {k: b"" for k in self.clients})
                self._relay({"op": "stop"})
            except (OSError, ProtocolError, SiteError):
                pass
            self.sock.close()
            self.sock = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_id(stdout: str):
    """The run id ``flwr run --format json`` printed (``None`` if it printed none)."""
    try:
        return json.loads(stdout[stdout.index("{") :]).get("run-id")
    except ValueError:
        return None
