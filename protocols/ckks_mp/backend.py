"""The multiparty CKKS backend (``--mode ckks-mp``): no party ever holds the whole secret key.

Scheme: Mouchet, Troncoso-Pastoriza, Bossuat, Hubaux, "Multiparty Homomorphic Encryption
from Ring-Learning-with-Errors", PoPETs 2021 — a collective secret ``s = sum_i s_i`` that no
party holds, each client's upload encrypted under its own share ``s_i`` with a public
per-ciphertext ``c1`` (so the sum of the uploads is an encryption under ``s``), and collective
public-key switching (PCKS, Protocol 5) of each aggregate block to its recipient's own key (collective
key switching to the clients' broadcast key for blocks every client receives),
with zero-sum masked shares, n-out-of-n; t-out-of-n with the ``threshold`` option (Mouchet,
Bertrand, Hubaux, J. Cryptology 2023: Shamir-shared ``s_i``, :mod:`.threshold`).

Why our own RNS arithmetic (option B) and not SEAL through TenSEAL's ``sealapi``: sealapi
reads key and ciphertext coefficients but cannot write them and exposes no NTT, so every
collective key, share and switched ciphertext would have to be forged as a SEAL-4
serialization (an undocumented, version-pinned layout) — and OpenFHE, which has the scheme,
does not load on this Python.  The protocols need only four ring operations (add, negate,
NTT-domain product, NTT); :mod:`.ring` implements them in ~150 lines of int64 numpy with
primes below 2^31, testable against a schoolbook convolution.  The add-only workload needs
no slots: values are packed as fixed-point integer fields into coefficients
(:mod:`.encoding`), which doubles the values per ciphertext over the canonical embedding,
makes packed integers exact with a worst-case (not statistical) noise bound, and lets the
recipient detect a corrupted share.  Relinearisation and rotation keys (needed only for
slot-wise products) are not built.

The backend is divided along the privacy boundary (:mod:`protocols.party`): one
:class:`~.client.CKKSMPClient` per client (its key shares are made there, from the OS CSPRNG,
and never leave it) and one :class:`~.server.CKKSMPServer` (public keys and ciphertexts only),
exchanging signed messages as bytes over a :class:`~protocols.link.ClientLink` in the stages
``key_setup`` (once per run), ``block_ids`` (sparse layout), ``upload``, ``keyswitch`` (each
client's partial decryption: its PCKS share, re-encrypted to the recipient's key) and
``download``.  The stages are described in :mod:`.client` and :mod:`.server`.  Every exchange:

1. **Plan** (public): the key switch of each block (:func:`.keyswitch.broadcast_blocks`) and
   :func:`.params.plan_exchange` for it -- primes ``L`` and ``L'``, scale ``2^D`` above the
   worst-case key-switching noise, field width from the public bounds, fields per
   coefficient; BoundError if the tolerance or the sum range does not fit.  Server and
   clients derive it from the same public facts; a client refuses a plan naming another
   (ModulusPlanError).
2. **Client-side validation before encryption** (in each client half): shapes, finiteness,
   every value in the public range (ShapeError / BoundError naming the client).  Integer
   exchanges played through this facade also audit the K-way sum against the public sum
   bound (``audit_sum_bound``, a simulation-side check, as in ``ckks``).
3. **Keys**: each client's share ``s_i`` and owner-signed recipient key ``p_R``; client 0 deals
   the broadcast key ``s_B`` to the other clients over the encrypted client-to-client channel
   (:mod:`protocols.channel`) and signs ``p_B``.  The CRS seed is a hash of the run id.  On
   ``--resume`` a new protocol object runs the key set-up again.
4. **Upload** ``c0`` under ``s_i`` (``c1`` public); the server checks every upload, adds per
   block and pads missing clients' public offsets.
5. **Key switch, chosen per block**: each block to its recipient's own key (PCKS), or once to the
   broadcast key ``s_B`` where the plan names that switch for the block (every recipient gets it, and every
   client is a recipient or the public schedule makes the tag a broadcast: weighted means, model
   averages) by collective key switching (CKS: one polynomial per share, a ``c0``-only download),
   which saves a factor K in share bytes for those blocks.  Each client computes ``c1`` itself and
   refuses a request it must not answer (:mod:`.client`).  n-out-of-n: a missing share aborts with DropoutError naming
   the client; a malformed one with IntegrityError.
6. **Recipients decrypt** in their halves; a residual above the worst-case noise bound or a
   field out of range raises IntegrityError (a corrupted share or ciphertext).

Against a server that deviates, see :mod:`.client` (the refusals).  Transcript payloads larger than
``keep_payload_bytes`` are dropped before recording (the note says so); ``nbytes`` is always
the real size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import BoundError, ConfigurationError, PackingOverflowError
from ..exchange import ExchangeContext, ValueSpec
from ..halves import HalvesProtocol
from ..party import envelope_of
from ..plan import ExchangePlan
from ..schedule import BROADCAST
from ..transcript import SERVER
from . import encryption
from .client import KEYS_TAG, CKKSMPClient
from .keyswitch import broadcast_blocks, planned_broadcast_blocks
from .params import MPParams, Plan, check_security, params_to_options, plan_exchange, ring_of, smudging_bits
from .party import MPClient
from .sampling import crs_seed, upload_c1
from .server import KEYSWITCH_BATCH_BYTES, CKKSMPServer

if TYPE_CHECKING:
    from ..dp import DPConfig
    from ..link import ClientLink
    from ..transcript import Message, Transcript

__all__ = ["CKKSMPProtocol", "KEYS_TAG"]


class CKKSMPProtocol(HalvesProtocol):
    """Multiparty RLWE (CKKS-style fixed point) secure aggregation, n-out-of-n or t-out-of-n.

    Options (``make_protocol('ckks-mp', K, ...)``):

    params:             an :class:`~.params.MPParams` (default N=8192, 7 x 31-bit primes,
                        eta=21, smudging 2^-50 per key-switched ciphertext for a budget of 2^20
                        of them per client); checked against the HE standard.
    keep_payload_bytes: largest message payload kept in the transcript.
    audit_sum_bound:    check integer K-way sums against the public bound before encrypting
                        (only where this facade holds every contribution).
    link:               the transport to the client halves (default: in-process halves).
    keyswitch_batch_bytes: the most key-switching share bytes (all clients' together; t-out-of-n: the
                        active set's) the server asks for in one call (default 256 MiB); an
                        exchange's key switch takes as many calls as its shares need
                        (:func:`.server.batches_of`).
    threshold:          t of t-out-of-n key switching (:mod:`.threshold`; default n, i.e.
                        n-out-of-n): any t clients can key-switch, so t clients together hold the
                        key (the collusion bound on the key drops from n - 1 to t - 1).
    """

    mode = "ckks-mp"
    upload_kind = "ciphertext"
    client_half = CKKSMPClient
    server_half = CKKSMPServer

    def __init__(
        self,
        num_clients: int,
        *,
        transcript: Transcript | None = None,
        dp: DPConfig | None = None,
        seed: int = 0,
        params: MPParams | None = None,
        keep_payload_bytes: int = 8 << 20,
        audit_sum_bound: bool = True,
        link: ClientLink | None = None,
        schedule: str = "",
        threshold: int | None = None,
        keyswitch_batch_bytes: int = KEYSWITCH_BATCH_BYTES,
        **collusion: Any,
    ):
        self.threshold = int(num_clients if threshold is None else threshold)
        if not 1 <= self.threshold <= num_clients:
            raise ConfigurationError(
                f"ckks-mp threshold {self.threshold} with {num_clients} clients: choose t in 1..{num_clients} "
                "(t clients together hold the key; the default n is n-out-of-n)"
            )
        c = int(collusion.get("max_colluders") or 0)
        if self.threshold < num_clients and 2 * self.threshold <= num_clients + c:
            raise ConfigurationError(
                f"ckks-mp threshold {self.threshold} with {num_clients} clients and {c} colluders: t-out-of-n needs "
                f"2t > n + c, i.e. t >= {(num_clients + c) // 2 + 1} (else two active sets share no honest client "
                "and the server could have two different sums key-switched)"
            )
        self.params = params or MPParams()
        check_security(self.params)
        self.ring = ring_of(self.params)
        self.keep_payload_bytes = int(keep_payload_bytes)
        if keyswitch_batch_bytes < 1:
            raise ConfigurationError(
                f"keyswitch_batch_bytes {keyswitch_batch_bytes}: the share bytes of one key-switching batch must be "
                "positive (default 256 MiB)"
            )
        self.keyswitch_batch_bytes = int(keyswitch_batch_bytes)
        self.audit_sum_bound = bool(audit_sum_bound)
        super().__init__(
            num_clients, transcript=transcript, dp=dp, seed=seed, link=link, schedule=schedule, **collusion
        )
        #: statistics of the key set-up and of the last exchange (bytes, seconds) -- for benchmarks
        self.setup_stats: dict[str, Any] | None = None
        self.last_stats: dict[str, Any] | None = None

    def public_options(self) -> dict[str, Any]:
        """Ring parameters, transcript payload limit; the threshold t below n, a batch bound but the default."""
        options: dict[str, Any] = {
            "params": params_to_options(self.params),
            "keep_payload_bytes": self.keep_payload_bytes,
        }
        if self.threshold < self.num_clients:  # n-out-of-n keeps its setup bytes unchanged
            options["threshold"] = self.threshold
        if self.keyswitch_batch_bytes != KEYSWITCH_BATCH_BYTES:  # so does the default batch bound
            options["keyswitch_batch_bytes"] = self.keyswitch_batch_bytes
        return options

    # ------------------------------------------------------------------ plan
    def plan(
        self, spec: ValueSpec, block_len: int | None = None, dp_std: float = 0.0, *, broadcast: bool = False
    ) -> Plan:
        """The exchange plan (level, scale, packed fields) for values of ``spec`` summed over all clients.

        ``broadcast``: switched to the broadcast key (CKS, every recipient gets every block), else per recipient.
        """
        return plan_exchange(self.params, spec, self.num_clients, dp_std, block_len, broadcast=broadcast)

    def plan_of(self, tag: str, rnd: int) -> Plan:
        """The encoding of exchange ``(tag, rnd)`` from the plan the server sent (attack simulations and tests).

        Raises:
            KeyError: no plan of that exchange is in the transcript.
        """
        for msg in self.transcript.select(tag=tag, round=rnd, sender=SERVER):
            if msg.note == "exchange plan" and isinstance(msg.payload, dict):
                plan = ExchangePlan.from_payload(msg.payload)
                cks = planned_broadcast_blocks(plan.encoding, plan.num_blocks)
                broadcast = cks.size == plan.num_blocks
                return plan_exchange(
                    self.params, plan.spec, self.num_clients, plan.dp_noise_std, plan.block_len, broadcast=broadcast
                )
        raise KeyError(f"no plan of exchange {tag!r} in round {rnd} in the transcript")

    def block_capacity(self, spec: ValueSpec) -> int:
        """Values one ciphertext carries for ``spec`` under the current DP noise; N when no plan fits."""
        dp_std = float(getattr(self.dp, "last_std", 0.0) or 0.0) if self.dp is not None else 0.0
        try:
            return self.plan(spec, dp_std=dp_std).capacity
        except BoundError:
            return self.params.n  # the exchange raises the error with the exchange named

    def plan_encoding(self, ctx: ExchangeContext) -> dict[str, Any]:
        """Plan the exchange's switch and moduli; with ``audit_sum_bound``, check integer sums against their bound.

        ``plan``: the levels, scale and packing (:func:`.params.plan_exchange`), sized for CKS's noise when every
        block goes to the broadcast key and for PCKS's otherwise; ``broadcast_blocks``: the blocks switched to the
        broadcast key (:func:`.keyswitch.broadcast_blocks`) and ``broadcast_to`` the exchange's recipients, both
        absent when every block is switched to its recipients' keys.  Every client checks both (:mod:`.client`).
        """
        ctx.check_requests(self.num_clients)
        public = self.schedule.roles.get(ctx.tag) == BROADCAST
        cks = broadcast_blocks(ctx.requests, ctx.num_blocks, self.num_clients, public)
        plan = plan_exchange(
            self.params,
            ctx.spec,
            self.num_clients,
            ctx.dp_noise_std,
            ctx.block_len,
            tag=ctx.tag,
            round=ctx.round,
            broadcast=cks.size == ctx.num_blocks,
        )
        if ctx.spec.integer and self.audit_sum_bound and all(t is not None for t in ctx.contributions.values()):
            self._audit_sum(ctx, plan)
        encoding: dict[str, Any] = {"plan": plan.describe(), "provisioned_dropouts": self.provisioned_dropouts(ctx)}
        if cks.size:
            encoding["broadcast_blocks"] = cks
            encoding["broadcast_to"] = np.array(sorted(int(r) for r in ctx.requests), dtype=np.int64)
        return encoding

    def _audit_sum(self, ctx: ExchangeContext, plan: Plan) -> None:
        """Test aid: check the K-way integer sums in the clear against the plan's field.

        Test aid: the K-way integer sums in the clear against the plan's field (no party could
        do this in a deployment; there the bound is enforced where the data is made).
        """
        from ..ckks.params import per_client_limits

        _, _, offset = per_client_limits(ctx.spec, ctx.dp_noise_std, self.num_clients)
        top, bottom = (1 << plan.width) - 1 - self.num_clients * offset, -self.num_clients * offset
        total = np.zeros((ctx.num_blocks, ctx.block_len))
        for table in ctx.contributions.values():
            total[np.asarray(table.ids, dtype=np.int64)] += np.asarray(table.values, dtype=np.float64)
        bad = np.nonzero((total > top) | (total < bottom))
        if bad[0].size:
            b, j = int(bad[0][0]), int(bad[1][0])
            raise PackingOverflowError(
                f"the {len(ctx.contributions)}-client sum of entry {j} of block {b} is {total[b, j]:g}, outside "
                f"[{bottom}, {top}] that the public bound sum_max={ctx.spec.sum_max} allows: its {plan.width}-bit "
                "field would carry into the next one. Nothing was encrypted. Fix: declare the true bound "
                "(e.g. degree cap + 1) in ValueSpec.sum_max",
                tag=ctx.tag,
                round=ctx.round,
            )

    # ------------------------------------------------------------------ facade views
    @property
    def _clients(self) -> dict[int, MPClient | None]:
        """What each in-process client half holds of the keys.

        :class:`.party.MPClient`; the attack suite's coalition reads its colluders'.
        """
        return {k: cast(CKKSMPClient, half).keys for k, half in self.clients.items()}

    def upload_ciphertexts(self, msg: Message, plan: Plan, blocks: Sequence[int] | None = None) -> np.ndarray:
        """The ciphertexts of an upload in the transcript, for attack simulations and tests.

        The ciphertexts ``[blocks * pieces, 2, L, N]`` (NTT form) of an upload in the transcript: its ``c0``
        (sent in coefficient form) and the public ``c1`` every party recomputes (``blocks``: the upload's block
        ids, default ``0 .. count-1``).  For attack simulations and tests.
        """
        count = int(msg.shape[0])
        blocks = list(range(count)) if blocks is None else list(blocks)
        pieces = -(-int(msg.shape[1]) // plan.capacity)
        c0 = self.ring.ntt(encryption.from_bytes(self.ring, msg.payload, (count * pieces, plan.level, plan.n)))
        c1 = upload_c1(
            crs_seed(self.setup.run_id),
            self.setup.session,
            envelope_of(msg).exchange,
            blocks,
            pieces,
            self.params.primes[: plan.level],
            plan.n,
        )
        return np.stack([c0, c1], axis=1)

    @property
    def fingerprint(self) -> str:
        """sha256 of the public context: parameters, CRS seed and broadcast public key."""
        server = cast(CKKSMPServer, self.server)
        server.ensure_keys(self.link, 0)
        return cast(str, server.fingerprint)  # set by ensure_keys

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        out = super()._aggregate(ctx)
        server, halves = cast(CKKSMPServer, self.server), cast(dict[int, CKKSMPClient], self.clients)
        plan = server.last_stats["plan"]
        if self.setup_stats is None and halves:
            comm = self.transcript.comm()["per_tag"][KEYS_TAG]
            self.setup_stats = {
                "client_s": {k: h.setup_s for k, h in halves.items()},
                "server_s": server.setup_s,
                "params": self.params.describe(),
                "bytes_up_per_client": comm["bytes_up"] / self.num_clients,
                "bytes_down_per_client": comm["bytes_down"] / self.num_clients,
            }
        timing = {k: h.timing for k, h in halves.items()}
        self.last_stats = {
            "tag": ctx.tag,
            "params": plan.describe(),
            "level": plan.level,
            "switch_level": plan.switch_level,
            "log_q": self.params.log_q(plan.level),
            "log_q_switched": self.params.log_q(plan.switch_level),
            "client_upload_s": {k: t.get("upload_s", 0.0) for k, t in timing.items() if k in ctx.contributions},
            "client_download_s": {k: t.get("keyswitch_s", 0.0) + t.get("download_s", 0.0) for k, t in timing.items()},
            "server_s": server.last_stats["server_s"],
            "smudging_bits": smudging_bits(self.params, self.num_clients),
            "error_bound": plan.error_bound,
        }
        return out
