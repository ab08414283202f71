"""``secure-fgl keys`` and ``secure-fgl manifest``: a site's identity key and the run manifest.

    secure-fgl keys new --out DIR                    an identity key (DIR/identity.key, mode 0600; stays on
                                                     the site) and DIR/identity.pub; prints the fingerprint
    secure-fgl keys show DIR|FILE                    the fingerprint of a key file
    secure-fgl manifest new --config FILE --party NAME=FINGERPRINT ... --out manifest.json
                                                     the run manifest; prints its comparison code
    secure-fgl manifest verify manifest.json [--config FILE] [--party NAME=FINGERPRINT | --key DIR --as NAME]
                                                     checks it and prints the code sites compare

See :mod:`protocols.manifest` for what the manifest holds and why the code is compared over a
channel the server does not control.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import ConfigError
from .layers import config_from_args

KEY_FILE, PUB_FILE = "identity.key", "identity.pub"


def add_key_parsers(sub) -> None:
    """Register ``keys`` and ``manifest`` under the ``secure-fgl`` subcommands ``sub``."""
    keys = sub.add_parser("keys", help="a site's identity key (new, show)", allow_abbrev=False)
    ks = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = ks.add_parser("new", help="make an identity key; prints its fingerprint", allow_abbrev=False)
    new.add_argument("--out", required=True, metavar="DIR", help=f"folder for {KEY_FILE} (0600) and {PUB_FILE}")
    show = ks.add_parser("show", help="print a key file's fingerprint", allow_abbrev=False)
    show.add_argument("path", metavar="DIR|FILE", help="a key folder (secure-fgl keys new --out) or a key file")

    man = sub.add_parser("manifest", help="the run manifest (new, verify)", allow_abbrev=False)
    ms = man.add_subparsers(dest="manifest_command", metavar="ACTION", required=True)
    mnew = ms.add_parser("new", help="build a run manifest; prints its comparison code", allow_abbrev=False)
    mnew.add_argument("--config", required=True, metavar="FILE", help="the run's config file (as for run)")
    mnew.add_argument("--preset", metavar="NAME", default=None, help="a preset the config file overrides")
    mnew.add_argument(
        "--party",
        action="append",
        required=True,
        metavar="NAME=FINGERPRINT",
        help="a party and its fingerprint (server, client0, client1, ...), once per party",
    )
    mnew.add_argument("--out", required=True, metavar="FILE", help="where to write the manifest (JSON)")
    ver = ms.add_parser("verify", help="check a manifest and print the code to compare", allow_abbrev=False)
    ver.add_argument("manifest", metavar="FILE", help="the manifest (secure-fgl manifest new --out)")
    ver.add_argument(
        "--config", metavar="FILE", default=None, help="recompute options and schedule from this config and compare"
    )
    ver.add_argument("--preset", metavar="NAME", default=None, help="a preset the config file overrides")
    ver.add_argument(
        "--party",
        action="append",
        default=[],
        metavar="NAME=FINGERPRINT",
        help="check that the manifest lists this fingerprint for this party",
    )
    ver.add_argument("--key", metavar="DIR|FILE", default=None, help="this site's identity key (with --as)")
    ver.add_argument("--as", dest="as_party", metavar="NAME", default=None, help="the party this site plays")


def key_command(args: argparse.Namespace) -> int:
    """``secure-fgl keys``: make a site's identity key (``new``, never overwriting one) or print a key's fingerprint."""
    from protocols.auth import SigningKey

    if args.keys_command == "new":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if (out / KEY_FILE).exists():
            raise ConfigError(
                f"{out / KEY_FILE} exists; a site keeps one identity key (use another --out, or "
                "delete the old key if it is to be replaced)"
            )
        key = SigningKey()
        key.save(out / KEY_FILE)
        (out / PUB_FILE).write_text(key.public_bytes.hex() + "\n")
        print(f"identity key: {out / KEY_FILE} (keep it on this site)")
        print(f"fingerprint:  {key.fingerprint}")
        return 0
    print(_load_key(args.path).fingerprint)
    return 0


def manifest_command(args: argparse.Namespace) -> int:
    """``secure-fgl manifest``: write a run manifest (``new``, never overwriting one) or check one.

    The check compares the parties' key fingerprints in the manifest with the ones expected (``--party``, or this
    site's ``--key`` ``--as`` a party).
    """
    from protocols.manifest import Manifest

    if args.manifest_command == "new":
        parties = _parties(args.party)
        cfg = _config(args.config, args.preset)
        options, security, schedule = _run_parameters(cfg, len(parties) - 1)
        manifest = Manifest.new(cfg.mode, parties, options, security, schedule)
        out = Path(args.out)
        if out.exists():
            raise ConfigError(f"{out} exists; a manifest is written once (choose another --out)")
        out.write_bytes(manifest.to_bytes() + b"\n")
        print(f"manifest: {out} ({cfg.mode}, {manifest.num_clients} clients)")
        print(f"comparison code: {manifest.comparison_code}")
        return 0
    manifest = Manifest.from_bytes(_read(args.manifest, "manifest"))
    problems = []
    wanted = _parties(args.party)
    if args.key or args.as_party:
        if not (args.key and args.as_party):
            raise ConfigError("--key and --as go together: this site's key file and the party it plays")
        wanted[args.as_party] = _load_key(args.key).fingerprint
    for party, fp in wanted.items():
        if manifest.parties.get(party) != fp:
            problems.append(f"{party}'s fingerprint is not {fp[:16]}... in the manifest")
    if args.config:
        options, security, schedule = _run_parameters(_config(args.config, args.preset), manifest.num_clients)
        for what, mine, theirs in (("options", options, manifest.options), ("schedule", schedule, manifest.schedule)):
            if mine != theirs:
                problems.append(f"the manifest's {what} differ from what {args.config} gives")
        for name, value in security.items():
            if manifest.security.get(name) != value:
                problems.append(
                    f"the manifest's security parameter {name} is {manifest.security.get(name)!r}, "
                    f"{args.config} gives {value!r}"
                )
    print(f"manifest: {args.manifest} ({manifest.mode}, {manifest.num_clients} clients)")
    for party, fp in sorted(manifest.parties.items(), key=lambda p: (p[0] != "server", len(p[0]), p[0])):
        print(f"  {party:<10} {fp}")
    print(f"comparison code: {manifest.comparison_code}")
    if problems:
        print("secure-fgl: error: " + "; ".join(problems), file=sys.stderr)
        return 2
    print("compare this code with every other site over a channel of your own before the run")
    return 0


# ---------------------------------------------------------------------- helpers
def _read(path: str, what: str) -> bytes:
    if not Path(path).is_file():
        raise ConfigError(f"{what} file {path} does not exist")
    return Path(path).read_bytes()


def _load_key(path: str):
    from protocols.auth import SigningKey

    p = Path(path)
    p = p / KEY_FILE if p.is_dir() else p
    _read(str(p), "identity key")
    return SigningKey.load(p)


def _parties(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, fp = item.partition("=")
        if not eq or not name or name in out:
            raise ConfigError(f"--party {item!r}: give NAME=FINGERPRINT once per party (e.g. client0=3f2a...)")
        out[name] = fp.strip().lower()
    return out


def _config(path: str, preset: str | None):
    return config_from_args(argparse.Namespace(config=path, preset=preset))


def _run_parameters(cfg, num_clients: int) -> tuple[dict, dict, str]:
    """The options, security parameters and schedule hash the run of ``cfg`` records in its manifest.

    Those of the protocol facade the run builds (no party is started).
    """
    from protocols.link import ClientLink

    from ..experiment import make_run_protocol

    class _NoClients(ClientLink):
        def call(self, stage, requests):
            raise ConfigError("building a manifest contacts no client")

    if cfg.clients != num_clients:
        raise ConfigError(f"the config has --clients {cfg.clients}, the manifest lists {num_clients} clients")
    protocol = make_run_protocol(cfg, num_clients, link=_NoClients())
    manifest = getattr(protocol, "manifest", None)
    if manifest is None:
        raise ConfigError(f"mode {cfg.mode} builds no run manifest")
    return manifest.options, manifest.security, manifest.schedule
