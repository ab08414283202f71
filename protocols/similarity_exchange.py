"""GCFL's similarity statistics as an exchange of a backend's halves.

GCFL's similarity statistics (docs/design.md shape 4) as an exchange of a backend's halves: the
server half learns the members' ``m x m`` cosine matrix and nothing else the protocol hides.

One exchange, tag ``T``; its plan (one block of the update's length, the members as
contributors, ``encoding = {"shape": SIMILARITY_SHAPE, "decider": d}``) tells each client half to
answer these stages instead of its backend's own steps:

``plain``
  ``upload``: each member's half sends its update, signed, in the clear (the plain server reads
  updates anyway); the server half computes the cosines.
``ckks`` (the steps of :mod:`protocols.ckks.similarity`, every party apart)
  ``key_setup`` (decider ``d`` only): ``d``'s half makes a fresh key pair for this exchange
  (:func:`~protocols.ckks.similarity.make_key_pair`) and keeps the secret context; it answers the
  evaluation context (public, relinearisation, Galois keys) to the server and the encryption
  context (public key only) to each other member, signed by ``d`` and relayed by the server,
  so a member encrypts only under a key ``d`` signed.
  ``upload``: each member's half checks ``d``'s signature, normalises its update (bound checked
  before encryption) and answers its ciphertexts; the server half refuses a public context
  that holds a secret key and evaluates one inner product per pair.
  ``download`` (``d`` only): the pair ciphertexts to ``d``, whose half decrypts them, drops the
  secret context and answers only the ``m(m-1)/2`` values.

A member or the decider that does not answer is named in a :class:`~protocols.errors.DropoutError`.
Same leaks as :mod:`protocols.ckks.similarity`: ``d`` plus the server could decrypt every upload.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .errors import DropoutError, IntegrityError
from .exchange import ValueSpec
from .plan import ExchangePlan
from .transcript import SERVER, Message, client_party

if TYPE_CHECKING:
    from .halves import HalvesProtocol
    from .party import ClientHalf, ServerHalf

__all__ = ["SIMILARITY_SHAPE", "similarity_over_halves", "similarity_client_step"]

#: the plan's ``encoding["shape"]`` of a similarity exchange (its wire value: plans keep their bytes)
SIMILARITY_SHAPE = "pairwise"


def _answer(server: ServerHalf, got: dict[int, list[Message]], k: int, stage: str, kind: str) -> Message:
    msg = server.responses(got, k, stage, kind=kind)
    if msg is None:
        raise DropoutError(
            f"client(s) {k} did not answer the '{stage}' stage of the similarity exchange", **server.where(k)
        )
    return msg


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    """Cosine similarities of the rows of ``vectors`` (a zero row has similarity 0 to all)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.maximum(norms, 1e-12)
    cosines: np.ndarray = unit @ unit.T
    return cosines


def similarity_over_halves(
    protocol: HalvesProtocol, tag: str, rnd: int, members: list[int], decider: int, length: int
) -> np.ndarray:
    """Server side: the ``[m, m]`` cosine matrix of the members' vectors.

    Server side: the ``[m, m]`` cosine matrix of the members' ``length``-vectors (rows in the
    order of ``members``), over ``protocol.link``; each member's half holds its own vector.
    """
    ckks = protocol.mode == "ckks"
    protocol._begin_exchange(tag, rnd)
    protocol._ensure_registered(rnd)
    server, link = protocol.server, protocol.link
    plan = ExchangePlan(
        tag,
        rnd,
        protocol.exchange,
        "dense",
        1,
        int(length),
        tuple(int(k) for k in members),
        {int(decider): np.zeros(1, np.int64)} if ckks else {},
        ValueSpec(),
        0.0,
        {"shape": SIMILARITY_SHAPE, "decider": int(decider)},
    )
    server.begin(plan, link, "")
    if not ckks:
        got = server.call(link, "upload", {k: [] for k in members})
        return cosine_matrix(
            np.stack([np.asarray(_answer(server, got, k, "upload", "plain").payload, np.float64) for k in members])
        )
    from .ckks.similarity import cosine_from_pairs, inner_products, public_context

    got = server.call(link, "key_setup", {decider: []})
    evaluation = public_context(bytes(_answer(server, got, decider, "key_setup", "public_key").payload), tag, rnd)
    got = server.call(link, "upload", {k: [] for k in members})
    uploads = [_answer(server, got, k, "upload", "ciphertext").payload for k in members]
    results = inner_products(evaluation, [list(u["frames"]) for u in uploads], tag=tag, rnd=rnd)
    pairs = server.message(decider, "ciphertext", (len(results), 1), results, "", note="one inner product per pair")
    got = server.call(link, "download", {decider: [(pairs, 0)]})
    values = np.asarray(_answer(server, got, decider, "download", "plain").payload, dtype=np.float64)
    if values.shape != (len(results),):
        raise IntegrityError(
            f"the decider answered {values.shape} values for {len(results)} pairs", **server.where(decider)
        )
    return cosine_from_pairs(values, [bool(u["nonzero"]) for u in uploads])


def similarity_client_step(half: ClientHalf, stage: str, inbox: list[Message]) -> list[tuple[Message, bytes]]:
    """Client side: this half's answer to ``stage`` of a similarity plan.

    Client side (:meth:`protocols.party.ClientHalf.handle` under a similarity plan): this
    half's answer to ``stage`` as sealed messages.
    """
    plan, where = cast(ExchangePlan, half.plan), half.where()
    decider = int(plan.encoding["decider"])
    if half.mode == "plain":
        update = np.asarray(half.contribution().values, dtype=np.float64).ravel()[: plan.block_len]
        return [half.seal(half.message(SERVER, "plain", (update.size,), update, ""), "upload")]
    from .ckks.similarity import SIMILARITY_CHAIN, decrypt_pairs, encrypt_unit, make_key_pair, public_context

    if stage == "key_setup":
        secret, evaluation, encryption = make_key_pair()
        half.similarity_secret = (plan.exchange, secret)
        out = [
            half.seal(
                half.message(
                    SERVER,
                    "public_key",
                    (),
                    evaluation,
                    "",
                    note="similarity evaluation context (public, relinearisation, Galois keys)",
                ),
                stage,
            )
        ]
        for k in plan.contributors:
            if k != half.id:
                msg = half.message(
                    client_party(k),
                    "public_key",
                    (),
                    encryption,
                    "",
                    note="similarity encryption context (public key), signed by the decider",
                )
                out.append(half.seal(replace(msg, relay=SERVER), stage))
        return out
    if stage == "upload":
        if half.id == decider:
            context = cast("tuple[int, Any]", half.similarity_secret)[1]  # made at key_setup
        else:
            keys = [m for m in inbox if m.sender == client_party(decider)]
            if len(keys) != 1:
                raise IntegrityError("no similarity key signed by the decider came with the upload request", **where)
            half.check(keys[0], client_party(decider), "key_setup", 0, where)
            context = public_context(bytes(keys[0].payload), plan.tag, plan.round)
        update = np.asarray(half.contribution().values, dtype=np.float64).ravel()[: plan.block_len]
        frames, nonzero = encrypt_unit(context, update, tag=plan.tag, rnd=plan.round, client=half.id)
        return [
            half.seal(
                half.message(
                    SERVER,
                    "ciphertext",
                    (len(frames), SIMILARITY_CHAIN.slots),
                    {"frames": frames, "nonzero": bool(nonzero)},
                    "",
                ),
                stage,
            )
        ]
    if stage == "download" and half.id == decider:
        pairs = [m for m in inbox if m.sender == SERVER]
        if len(pairs) != 1 or half.similarity_secret is None or half.similarity_secret[0] != plan.exchange:
            raise IntegrityError("a similarity download without its key set-up or its one server message", **where)
        half.check(pairs[0], SERVER, stage, 0, where)
        secret, half.similarity_secret = half.similarity_secret[1], None
        values = decrypt_pairs(secret, list(pairs[0].payload))
        return [half.seal(half.message(SERVER, "plain", (values.size,), values, ""), stage)]
    raise IntegrityError(f"no similarity step '{stage}' for client {half.id}", **where)
