"""The server half of ``ckks``: public contexts only; checks every ciphertext, adds, routes.

One exchange (:meth:`CKKSServer.run`) over a :class:`~protocols.link.ClientLink`, one method per
stage:

1. ``key_setup`` (:meth:`~CKKSServer.ensure_keys`, first use of a chain): client 0 makes the key
   pair; the server keeps the public context (no secret, Galois or relinearisation keys) and
   relays the channel-encrypted secret context to every other client.
2. ``block_ids`` (:meth:`~CKKSServer.collect_block_ids`, sparse layout): each contributor's block
   ids, in the clear (the documented leak), checked increasing and in range.
3. ``upload`` (:meth:`~CKKSServer.collect_upload`, one call per streamed chunk): the envelope
   (context fingerprint of this exchange's chain, round, tag), the shape and every ciphertext's
   bytes, scale and level of ALL contributors checked before any is added.  A contributor
   missing from the first chunk drops out (a survivors' sum, unless DP noise shares are due);
   one missing later aborts (its blocks are in earlier partial sums, which are discarded).
4. adding (:meth:`~CKKSServer.add_chunk`): per needed block id, the ciphertexts of the clients
   that uploaded it (no multiplication, no rotation); missing clients' public DP offsets padded.
   Dense layout under symmetric encryption: only ``sum c0`` is formed and the upload seeds kept
   (:mod:`.seeded`); otherwise SEAL adds whole ciphertexts.
5. ``download`` (:meth:`~CKKSServer.send_download`, one call per chunk): each recipient only the
   blocks it requested, in one signed message (``sum c0`` and the seeds, or the full sum).

Every ciphertext has a fixed padded size per chain, so every message size is a function of
public shapes only.  Transcript: one upload (download) Message per client per exchange;
payloads of streamed exchanges or above ``keep_payload_bytes`` are stripped before recording.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import DropoutError, IntegrityError, ShapeError
from ..party import ServerHalf
from ..plan import ExchangePlan
from ..transcript import SERVER, Message, client_party
from . import wire
from .fixed_point import SealSum, server_load
from .keys import ServerContext
from .params import ChainParams, EncodingPlan
from .plan_message import KEYS_TAG, chunks, pieces, plan_from_payload
from .seeded import SeededSum, load_upload, upload_bytes, uses_seeded_download

if TYPE_CHECKING:
    from ..link import ClientLink
    from ..party import PartySetup
    from ..transcript import Transcript


@dataclass
class _Exchange:
    """What the server's stages share within one exchange (all public)."""

    plan: ExchangePlan
    ep: EncodingPlan
    context: ServerContext
    bounds: list[tuple[int, int]]
    vec_lens: list[int]
    spans: list[tuple[int, int]]
    contributors: list[int]
    #: the parties the first call of the exchange reaches (every party learns the plan)
    first_call: dict[int, list[tuple[Message, int]]] = field(default_factory=dict)
    #: downloads as ``sum c0`` plus the upload seeds (:mod:`.seeded`), else full ciphertexts
    seeded: bool = False
    #: contributors that stopped answering before their first upload
    dropped: list[int] = field(default_factory=list)
    #: per contributor, the ids of the blocks it uploads
    ids: dict[int, np.ndarray] = field(default_factory=dict)
    server_s: float = 0.0

    @property
    def fingerprint(self) -> str:
        return self.context.fingerprint

    @property
    def n_pieces(self) -> int:
        return len(self.bounds)


class CKKSServer(ServerHalf):
    """The CKKS server (module docstring): public contexts only; checks every ciphertext, adds, routes."""

    mode = "ckks"
    relays_between_clients = True
    relay_stages = frozenset({"key_setup"})

    def __init__(self, setup: PartySetup, transcript: Transcript | None = None):
        super().__init__(setup, transcript)
        self.contexts: dict[str, ServerContext] = {}
        self.keep_payload_bytes = int(setup.options["keep_payload_bytes"])
        self.last_stats: dict[str, Any] = {}

    def record(self, msg: Message) -> None:
        """Record a message, stripping ciphertext payloads the transcript does not keep.

        Relayed secret contexts get a note; streamed upload ciphertexts are kept without payload once there is more than
        one.
        """
        if msg.relay == SERVER and not msg.note and msg.tag == KEYS_TAG:
            msg = replace(msg, note="secret context (channel-encrypted, relayed by the server)")
            if msg.nbytes > self.keep_payload_bytes:
                msg = msg.without_payload()
        if (
            self._streaming is not None
            and msg.tag == cast(ExchangePlan, self.plan).tag
            and msg.kind == "ciphertext"
            and msg.relay != SERVER
        ):
            sent = self._streaming.setdefault((msg.sender, msg.receiver), [])
            sent.append(msg)
            if len(sent) > 1 or msg.nbytes > self.keep_payload_bytes:
                # recorded without payloads (_record_streamed): drop the ciphertexts now, not when the
                # exchange ends (a 1e6-node pre-training held ~1 GB of them)
                sent[:] = [m.without_payload() for m in sent]
            return
        super().record(msg)

    _streaming: dict[tuple[str, str], list[Message]] | None = None

    # ------------------------------------------------------------------ stage key_setup
    def ensure_keys(self, chain: ChainParams, link: ClientLink, rnd: int) -> ServerContext:
        """The public context of ``chain``: on first use, client 0 makes the key pair."""
        if chain.name in self.contexts:
            return self.contexts[chain.name]
        self.register(link, rnd, range(self.setup.num_clients))
        part = len(self.contexts)
        request = Message(
            rnd,
            KEYS_TAG,
            SERVER,
            client_party(0),
            "control",
            (),
            0,
            self.mode,
            "",
            {
                "chain": {
                    "name": chain.name,
                    "n": chain.poly_modulus_degree,
                    "bits": np.asarray(chain.coeff_mod_bit_sizes, np.int64),
                }
            },
            note="key set-up request",
        )
        got = self.call(link, "key_setup", {0: [(request, part)]}, hook=False)
        where: dict[str, Any] = dict(tag=KEYS_TAG, round=rnd, client=0)
        pub = [m for m in got.get(0, []) if m.receiver == SERVER]
        if len(pub) != 1:
            raise DropoutError("client 0 did not answer the key set-up", **where)
        self.check(pub[0], client_party(0), "key_setup", part, where)
        relayed = [m for m in got[0] if m.relay == SERVER]
        if len(relayed) != self.setup.num_clients - 1:
            raise IntegrityError("client 0 did not send the secret context to every client", **where)
        context = ServerContext(pub[0].payload, chain)  # the server: public bytes only
        if context.fingerprint != pub[0].fingerprint:
            raise IntegrityError("the public context does not match its fingerprint", **where)
        self.contexts[chain.name] = context
        return context

    # ------------------------------------------------------------------ one exchange
    def run(self, plan: ExchangePlan, link: ClientLink) -> tuple[int, ...]:
        """Run one CKKS exchange: collect block ids, add the uploaded ciphertexts, send each recipient its sums.

        The server only adds ciphertexts; it never holds the secret key.
        """
        t_setup = time.perf_counter()
        ep = plan_from_payload(plan.encoding["plan"])
        self.plan, self.exchange = plan, plan.exchange
        context = self.ensure_keys(ep.chain, link, plan.round)
        plan = dataclasses.replace(plan, encoding={**plan.encoding, "fingerprint": context.fingerprint})
        self.begin(plan, link, context.fingerprint)
        bounds, vec_lens = pieces(ep, plan.block_len)
        x = _Exchange(
            plan,
            ep,
            context,
            bounds,
            vec_lens,
            chunks(plan.num_blocks, int(plan.encoding["blocks_per_chunk"])),
            list(plan.contributors),
            first_call={k: [] for k in plan.parties},
            seeded=uses_seeded_download(plan.layout, self.setup.options["encryption"]),
        )
        setup_s = time.perf_counter() - t_setup
        self.collect_block_ids(x, link)
        needed = np.zeros(plan.num_blocks, dtype=bool)
        for bids in plan.requests.values():
            needed[bids] = True
        self._streaming = {}
        try:
            for part in range(len(x.spans)):
                loaded = self.collect_upload(x, link, part)
                t = time.perf_counter()
                frames = self.add_chunk(x, loaded, needed)
                x.server_s += time.perf_counter() - t
                self.send_download(x, link, part, frames)
        finally:
            streamed, self._streaming = self._streaming, None
            self._record_streamed(streamed)
        self.last_stats = {
            "chunks": len(x.spans),
            "ciphertexts_per_block": x.n_pieces,
            "server_s": x.server_s,
            "setup_s": setup_s,
            "bytes_up": {k: sum(m.nbytes for m in streamed.get((client_party(k), SERVER), [])) for k in x.contributors},
            "bytes_down": {
                r: sum(m.nbytes for m in streamed.get((SERVER, client_party(r)), [])) for r in plan.requests
            },
        }
        return tuple(x.contributors)

    # ------------------------------------------------------------------ stage block_ids
    def collect_block_ids(self, x: _Exchange, link: ClientLink) -> None:
        """Each contributor's block ids: asked in the sparse layout (every block in the dense one)."""
        plan = x.plan
        if plan.layout != "sparse":
            x.ids = {k: np.arange(plan.num_blocks) for k in x.contributors}
            return
        got = self.call(link, "block_ids", x.first_call)
        x.first_call = {}
        for k in x.contributors:
            msg = self.responses(got, k, "block_ids", "metadata")
            if msg is None:
                x.dropped.append(k)
                continue
            self.check_envelope(msg, x.fingerprint, k)
            ids = np.asarray((msg.payload or {}).get("block_ids", []), dtype=np.int64).ravel()
            if ids.size and (ids.min() < 0 or ids.max() >= plan.num_blocks or (np.diff(ids) <= 0).any()):
                raise ShapeError(f"block ids must be increasing in [0, {plan.num_blocks})", **self.where(k))
            x.ids[k] = ids
        x.contributors = [k for k in x.contributors if k not in x.dropped]

    # ------------------------------------------------------------------ stage upload
    def collect_upload(self, x: _Exchange, link: ClientLink, part: int) -> dict[int, tuple[np.ndarray, list[Any]]]:
        """Collect and check chunk ``part`` of every contributor's upload.

        Chunk ``part`` of every contributor's upload, every ciphertext checked and loaded
        before any is added: contributor -> (its block ids in the chunk, its ciphertexts).
        """
        plan = x.plan
        b0, b1 = x.spans[part]
        got = self.call(link, "upload", {**x.first_call, **{k: [] for k in x.contributors}})
        x.first_call = {}
        t = time.perf_counter()
        missing = [k for k in x.contributors if k not in got]
        if part == 0 and missing:  # not a contributor after all: a survivors' sum
            x.dropped += missing
            x.contributors = [k for k in x.contributors if k not in missing]
            missing = []
        if x.dropped and (plan.dp_noise_std > 0 or not x.contributors):
            raise self._missing(
                x.dropped,
                "upload",
                "every contributor dropped" if not x.contributors else "each contributor adds a share of the DP noise",
            )
        if missing:  # after its first chunk: its blocks are in the sums already
            raise self._missing(missing, "upload")
        loaded = {}
        for k in x.contributors:
            msg = self.responses(got, k, "upload", "ciphertext", part)
            if msg is None:
                raise self._missing([k], "upload")
            self.check_envelope(msg, x.fingerprint, k)
            ids = x.ids[k]
            sel = ids[(ids >= b0) & (ids < b1)]
            if (
                tuple(msg.shape) != (sel.size, plan.block_len)
                or not isinstance(msg.payload, (list, tuple))
                or len(msg.payload) != sel.size * x.n_pieces
            ):
                n = len(msg.payload) if isinstance(msg.payload, (list, tuple)) else None
                raise ShapeError(
                    f"upload of shape {tuple(msg.shape)} with {n} ciphertexts; expected shape "
                    f"{(sel.size, plan.block_len)} in {sel.size * x.n_pieces} ciphertexts",
                    **self.where(k),
                )
            loaded[k] = (sel, [self._load(x, f, k, i) for i, f in enumerate(msg.payload)])
        x.server_s += time.perf_counter() - t
        return loaded

    def add_chunk(
        self, x: _Exchange, loaded: dict[int, tuple[np.ndarray, list[Any]]], needed: np.ndarray
    ) -> dict[int, list[bytes]]:
        """Per needed block id, the sum of the loaded ciphertexts as framed bytes.

        Per needed block id, the sum of the loaded ciphertexts (missing clients' public DP
        offsets padded), as framed bytes: block id -> one frame per piece.
        """
        ep, n_pieces, K = x.ep, x.n_pieces, self.setup.num_clients
        sums: dict[int, list[Any]] = {}
        counts: dict[int, int] = {}
        for k in x.contributors:
            sel, vecs = loaded[k]
            for i, bid in enumerate(sel.tolist()):
                if not needed[bid]:
                    continue
                block = vecs[i * n_pieces : (i + 1) * n_pieces]
                if bid in sums:
                    for acc, v in zip(sums[bid], block):
                        acc.add_(v)
                else:
                    sums[bid] = block
                counts[bid] = counts.get(bid, 0) + 1
        if ep.layout is not None and ep.layout.offset:
            for bid, c in counts.items():  # pad missing clients' DP offsets (public)
                if c < K:
                    const = ep.layout.offset_constant(K - c)
                    for acc, n in zip(sums[bid], x.vec_lens):
                        acc.add_constant_(const, n)
        return {
            bid: [wire.frame(acc.serialize(), acc.padded_bytes, allow_larger=True) for acc in accs]
            for bid, accs in sums.items()
        }

    # ------------------------------------------------------------------ stage download
    def send_download(self, x: _Exchange, link: ClientLink, part: int, frames: dict[int, list[bytes]]) -> None:
        """Send each recipient its requested blocks of chunk ``part`` in one signed message.

        Each recipient's requested blocks of chunk ``part`` in one signed message (an empty
        frame for a block no client uploaded).
        """
        plan = x.plan
        b0, b1 = x.spans[part]
        downloads = {}
        for r, bids in plan.requests.items():
            mine = [int(b) for b in bids if b0 <= int(b) < b1]
            payload = [f for b in mine for f in frames.get(b, [wire.EMPTY] * x.n_pieces)]
            downloads[r] = [
                (
                    self.message(
                        r, "ciphertext", (len(mine), plan.block_len), payload, x.fingerprint, note=x.ep.describe()
                    ),
                    part,
                )
            ]
        self.call(link, "download", downloads)

    def _missing(
        self,
        clients: list[int],
        stage: str,
        why: str = "a client that stops answering during its upload leaves a partial sum",
    ) -> DropoutError:
        err = DropoutError(
            f"client(s) {', '.join(map(str, clients))} did not answer the '{stage}' stage ({why}); "
            "nothing was aggregated. Re-run it without them",
            **self.where(clients[0]),
        )
        err.clients = tuple(clients)
        return err

    def _load(self, x: _Exchange, frame: object, client: int, index: int) -> SeededSum | SealSum:
        server, plan = x.context, x.ep
        where = self.where(client)
        expected = wire.HEADER_BYTES + (
            upload_bytes(server.chain)
            if x.seeded
            else server.chain.upload_ciphertext_bytes(self.setup.options["encryption"])
        )
        if not isinstance(frame, (bytes, bytearray)) or len(frame) != expected:
            size = len(frame) if isinstance(frame, (bytes, bytearray)) else type(frame).__name__
            raise IntegrityError(
                f"ciphertext {index} is {size} bytes, expected {expected}: truncated, corrupted "
                f"or not made with this exchange's parameters ({server.chain.describe()})",
                **where,
            )
        try:
            body = wire.unframe(frame)
        except ValueError as exc:
            raise IntegrityError(f"ciphertext {index}: {exc}", **where) from exc
        try:  # packed seed and c0 where downloads are seeded, else a SEAL ciphertext (seeded if symmetric)
            if x.seeded:
                return load_upload(server.chain, body, plan.scale)
            return server_load(server.chain, body, plan.scale)
        except ValueError as exc:
            raise IntegrityError(f"ciphertext {index} {exc}", **where) from exc

    def _record_streamed(self, streamed: dict[tuple[str, str], list[Message]]) -> None:
        """One upload (download) Message per client per exchange; large or streamed payloads are stripped."""
        for msgs in streamed.values():
            if len(msgs) == 1:
                msg = msgs[0]
                if msg.nbytes > self.keep_payload_bytes:
                    msg = replace(msg, payload=None, note=msg.note + "; payload not kept (size)")
            else:
                last = msgs[-1]
                shape: tuple[int, ...]
                try:
                    shape = (sum(int(m.shape[0]) for m in msgs), cast(ExchangePlan, self.plan).block_len)
                except (TypeError, ValueError, IndexError):  # a tampered shape: record it as sent
                    shape = last.shape
                msg = replace(
                    last,
                    shape=shape,
                    nbytes=sum(int(m.nbytes) for m in msgs),
                    payload=None,
                    note=last.note + f"; streamed in {len(msgs)} chunks, payload not kept",
                )
            super().record(msg)
