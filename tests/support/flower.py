"""A Flower federation on 127.0.0.1 for the tests.

One SuperLink, and per site one SuperNode and one site process (holding one or several clients), each a subprocess
that :meth:`Federation.close` kills. Every wait is bounded.

The tests' SuperNodes wait :data:`NODE_POLL` seconds instead of Flower's fixed 3 s between two
empty polls of the SuperLink, and :data:`NODE_BUSY_WAIT` instead of 0.5 s between two looks for a
reply in their own memory: Flower has no option for either, so the SuperNode runs with its
module's ``time.sleep`` capped (:func:`supernode`).
Deployments run the stock ``flower-supernode``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
#: the tests' SuperNode idle poll (seconds)
NODE_POLL = 0.3
#: the tests' SuperNode's look at its own state for a reply, while a ClientApp task runs (seconds)
NODE_BUSY_WAIT = 0.02


def supernode(poll: float | None) -> list[str]:
    """A SuperNode's command: ``flower-supernode``, or one whose loop waits less.

    With ``poll`` (seconds): its idle wait (3 s between two empty polls of the SuperLink) capped at
    ``poll``, and its waits for a reply it is about to receive (0.5 s between two looks at its own
    in-memory state, no request) capped at :data:`NODE_BUSY_WAIT`.
    """
    if poll is None:
        return [str(BIN / "flower-supernode")]
    code = (
        "import time, types\n"
        "import flwr.supernode.start_client_internal as node\n"
        "from flwr.supernode.cli.flower_supernode import flower_supernode\n"
        "clock = {n: getattr(time, n) for n in dir(time) if not n.startswith('_')}\n"
        f"clock['sleep'] = lambda s: time.sleep(min(s, {float(poll)} if s >= 3 else {NODE_BUSY_WAIT}))\n"
        "node.time = types.SimpleNamespace(**clock)\n"
        "flower_supernode()\n"
    )
    return [sys.executable, "-c", code]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Federation:
    """Sites behind their SuperNodes and a SuperLink.

    ``clients`` clients on ``sites`` sites (default: one each; client ``k`` on site ``k % sites``),
    each site behind its SuperNode, and a SuperLink; ``tls``: a dict of the paths :func:`make_tls`
    wrote (TLS and SuperNode authentication on), else insecure (tests only).  ``site_args``: more
    arguments of every site process, or a function of the client giving them (after its
    ``--client``); ``site_flags``: arguments of every site process, given once (e.g.
    ``--allow-attack-simulation``).  Site ``s``'s processes are ``site<s>`` and ``supernode<s>``.  ``resident``: each
    site process runs its ClientApp tasks itself (``--clientappio``, SuperNode ``--isolation
    process``), else its SuperNode starts a ``flwr-clientapp`` process per message (Flower's default).
    ``node_poll``: the SuperNodes' idle poll (:func:`supernode`); ``None``: the stock ``flower-supernode``.
    """

    def __init__(
        self,
        folder: Path,
        clients: int,
        tls: dict | None = None,
        timeout: float = 60.0,
        site_args=(),
        site_flags=(),
        sites: int | None = None,
        resident: bool = True,
        node_poll: float | None = NODE_POLL,
    ):
        self.folder, self.procs, self.port, self.tls = Path(folder), {}, free_port(), tls
        self.argv: dict[str, list[str]] = {}
        self.env = {
            **os.environ,
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_HOME": str(self.folder / "flwr-home"),
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5",
        }
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        secure = f'root-certificates = "{tls["ca"]}"' if tls else "insecure = true"
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{self.port}"\n{secure}\n'
        )
        try:
            link = [
                str(BIN / "flower-superlink"),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--disable-runtime-dependency-installation",
            ]
            link += (
                [
                    "--ssl-ca-certfile",
                    tls["ca"],
                    "--ssl-certfile",
                    tls["cert"],
                    "--ssl-keyfile",
                    tls["key"],
                    "--enable-supernode-auth",
                ]
                if tls
                else ["--insecure"]
            )
            (self.folder / "superlink.argv").write_text(" ".join(link))
            self.spawn("superlink", link)
            sites = clients if sites is None else sites
            socks = [self.folder / f"site{k}" / "site.sock" for k in range(sites)]
            ports = [free_port() for _ in socks]  # each SuperNode's runtime API
            for k, sock in enumerate(socks):  # the sites need no SuperLink: they start (import torch) meanwhile
                held = ["--clientappio", f"127.0.0.1:{ports[k]}"] if resident else []
                for client in range(k, clients, sites):
                    held += ["--client", str(client), *(site_args(client) if callable(site_args) else site_args)]
                self.spawn(
                    f"site{k}",
                    [sys.executable, "-m", "secure_fgl.runtime.flower_site", "--socket", str(sock), *held, *site_flags],
                )
            self.wait_listening(self.port, timeout)
            for k, sock in enumerate(socks):
                if tls:
                    self.register(tls["node_pub"][k], tls["ca"])
                node = [
                    *supernode(node_poll),
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(ports[k]),
                    *(["--isolation", "process"] if resident else []),
                    "--node-config",
                    f'site-socket="{sock}"',
                    "--max-wait-time",
                    str(timeout),
                ]
                node += (
                    ["--root-certificates", tls["ca"], "--auth-supernode-private-key", tls["node_key"][k]]
                    if tls
                    else ["--insecure"]
                )
                self.spawn(f"supernode{k}", node)
        except BaseException:
            self.close()
            raise

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        self.argv[name] = argv
        with open(self.folder / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """Kill process ``name`` (e.g. ``supernode2``) and its children at once, as a crash would."""
        os.killpg(self.procs[name].pid, 9)
        self.procs[name].wait(timeout=10)

    def restart(self, name: str) -> None:
        """Start process ``name`` (killed by :meth:`kill`) again with its command, as its operator would."""
        self.spawn(name, self.argv[name])

    def register(self, public_key: str, ca: str) -> None:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``)."""
        out = subprocess.run(
            [str(BIN / "flwr"), "supernode", "register", public_key, "test"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.folder,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr

    def wait_listening(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if any(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(0.1)
        raise RuntimeError(f"the SuperLink did not listen on 127.0.0.1:{port}: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.folder.glob("*.log"))

    def close(self) -> None:
        """Kill every process this federation started (their process groups), then reap them."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 15)
                except ProcessLookupError:
                    pass
        for proc in reversed(list(self.procs.values())):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)


@contextmanager
def serving(fed: Federation) -> Iterator[Federation]:
    """Yield ``fed`` with this process pointed at its Flower home (no update check); close it afterwards."""
    saved = {k: os.environ.get(k) for k in ("FLWR_HOME", "FLWR_DISABLE_UPDATE_CHECK")}
    os.environ.update(FLWR_HOME=fed.env["FLWR_HOME"], FLWR_DISABLE_UPDATE_CHECK="1")
    try:
        yield fed
    finally:
        fed.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def identity_keys(folder: Path, clients: int) -> dict[str, Path]:
    """Each site's and the aggregator's identity key, made where it stays.

    ``secure-fgl keys new --out FOLDER/<party>``. Party -> its key folder.
    """
    from secure_fgl.cli.main import main

    parties = ["server", *(f"client{k}" for k in range(clients))]
    for party in parties:
        assert main(["keys", "new", "--out", str(folder / party)]) == 0
    return {party: folder / party for party in parties}


def write_manifest(keys: dict[str, Path], cfg, manifest: Path, fingerprints: dict | None = None):
    """The operator's step before a run: the manifest of run ``cfg``.

    The operator's step before a run: the manifest of run ``cfg`` from the parties' public
    keys (``secure-fgl manifest new``; ``fingerprints`` replaces some), then each site's check of
    it against its own key (``secure-fgl manifest verify --key --as``).  Returns ``cfg`` with
    ``--manifest`` and the aggregator's ``--identity-key``.
    """
    import dataclasses
    import json

    from protocols.auth import SigningKey
    from secure_fgl.cli.main import main

    cfg = dataclasses.replace(cfg, manifest=None, identity_key=None)
    config = manifest.with_suffix(".config.json")
    config.write_text(json.dumps(cfg.to_dict()))
    fps = {p: SigningKey.load(d / "identity.key").fingerprint for p, d in keys.items()} | (fingerprints or {})
    manifest.unlink(missing_ok=True)
    new = ["manifest", "new", "--config", str(config), "--out", str(manifest)]
    assert main([*new, *(f"--party={p}={fp}" for p, fp in fps.items())]) == 0
    if not fingerprints:
        for party, folder in keys.items():
            verify = ["manifest", "verify", str(manifest), "--config", str(config)]
            assert main([*verify, "--key", str(folder), "--as", party]) == 0
    return dataclasses.replace(cfg, manifest=str(manifest), identity_key=str(keys["server"] / "identity.key"))


def make_tls(folder: Path, clients: int) -> dict:
    """A self-signed CA and the certificates and keys of the SuperLink and SuperNodes.

    A self-signed CA, the SuperLink's certificate for 127.0.0.1 (signed by it) and one ECDSA
    key pair per SuperNode (its public key in OpenSSH form, as ``flwr supernode register`` takes it).
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject_key, subject, issuer_key, issuer, ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(subject_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    def write(name: str, data: bytes) -> str:
        (folder / name).write_bytes(data)
        os.chmod(folder / name, 0o600)
        return str(folder / name)

    pem = serialization.Encoding.PEM

    def private(key) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key, link_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    link_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    paths = {
        "ca": write("ca.crt", cert(ca_key, ca_name, ca_key, ca_name, True).public_bytes(pem)),
        "cert": write("superlink.crt", cert(link_key, link_name, ca_key, ca_name, False).public_bytes(pem)),
        "key": write("superlink.key", private(link_key)),
        "node_key": [],
        "node_pub": [],
    }
    for k in range(clients):
        key = ec.generate_private_key(ec.SECP384R1())
        paths["node_key"].append(
            write(
                f"node{k}.key",
                key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
            )
        )
        paths["node_pub"].append(
            write(
                f"node{k}.pub",
                key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
            )
        )
    return paths
