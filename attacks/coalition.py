"""Server + c colluding clients: what they read by breaking the protocol, and what the aggregate implies.

The observer is the server together with clients ``C`` (``|C| = c``, default 1), pooling
everything they hold: the server's view of the transcript (uploads, relayed channel
ciphertexts, unmasking shares) and each colluding client's own secrets (its CKKS key ring;
in mask mode its pairwise seeds, its Shamir shares of the others' secrets and the group seed).
Two quantities are reported separately, per exchange:

(a) **break** -- the fraction of a non-coalition client's individual upload the coalition
    reads by attacking the cryptography.  Shared-key CKKS: every upload (each client holds
    the secret key).  Mask (Bonawitz double masking): the coalition removes the output mask
    ``R_v`` (group seed), the pairwise masks it shares with the victim or that survivors revealed
    when the victim was declared dropped, the self mask if it can rebuild the victim's seed from
    ``>= t`` Shamir shares (server's unmasking shares + the coalition's own),
    and compares what is left with the victim's encoded input (exact ring equality; chance
    ``2^-b`` per entry).  With ``c < t`` and at least one honest peer: 0 beyond chance.
    Multiparty CKKS (``ckks-mp``): the upload is encrypted under the victim's share ``s_v``.
    n-out-of-n: the coalition tries the sum of its own shares ``sum_{i in C} s_i`` (never ``s_v``).
    t-out-of-n: it interpolates its Shamir shares of ``s_v`` at 0 with the Lagrange weights of
    ``A`` = its first ``min(c, t)`` members, ``s_v = sum_{j in A} lambda_j^A sigma_{v,j}`` when
    ``c >= t`` (Mouchet, Bertrand, Hubaux, J. Cryptology 2023); with ``c < t`` the result is uniform.
    Reported as the |correlation| with the victim's plaintext on a probe exchange (chance
    ``1/sqrt(n)``).
    Whether the coalition holds the key is decided by the run's key collusion bound
    (:func:`key_collusion_bound`): ``c`` clients hold it when ``c`` exceeds the bound.
(b) **implied** -- the fraction of the blocks a coalition client receives whose aggregate has
    exactly one non-coalition contributor: aggregate minus the coalition's own inputs is that
    client's value, in every mode (e.g. a FedGCN row with two contributors).  Legitimate
    output, not a protocol break; it is what secure aggregation cannot hide.

Scoring uses each victim's encoded input kept in the simulated client memory
(``MaskProtocol.keep_client_state``) or the exchange's contributions; it never enters the
estimate.
"""

from __future__ import annotations

import numpy as np

from protocols.mask.keys import output_mask_keys
from protocols.mask.prg import ranked_mask, ring_mask, stream_id
from protocols.mask.shamir import Share, combine
from protocols.transcript import SERVER, client_party, party_client


def _rebuild(shares: list[Share], t: int) -> bytes | None:
    pts = {s.x: s for s in shares}
    if len(pts) < t:
        return None
    try:
        return combine(pts.values(), t)
    except ValueError:
        return None


def mask_break(proto, tag: str, rnd: int, victim: int, coalition: list[int]) -> dict:
    """(a) for one mask upload.

    The coalition's best unmasking of ``victim``'s upload of the last exchange (needs ``proto.keep_client_state``).
    Returns ``{'recovered': fraction of entries equal to the victim's encoded input, 'chance', 'removed': [...],
    'estimate': ring array}``.
    """
    state, binding = proto.last_client_state, proto.last_binding
    if not state or binding is None:
        raise ValueError("run the exchange with proto.keep_client_state = True")
    msgs = [m for m in proto.transcript.view(SERVER) if m.tag == tag and m.round == rnd]
    ups = [m for m in msgs if m.kind == "masked" and m.sender == client_party(victim) and m.receiver == SERVER]
    if not ups or ups[-1].payload is None:
        raise ValueError(f"no upload of client {victim} in the server's view")
    enc, t = proto.last_encoding, int(proto.last_stats["params"]["threshold"])
    dtype, L = enc.dtype, int(ups[-1].shape[1])
    ids = np.asarray(ups[-1].payload["block_ids"], dtype=np.int64)
    y = enc.from_wire(ups[-1].payload["data"], (ids.size, L))
    sid = {p: stream_id(p, proto.run_id, binding.seq, tag, rnd) for p in ("pairwise", "self", "output")}
    blocks = {
        party_client(m.sender): np.asarray(m.payload["block_ids"], np.int64)
        for m in msgs
        if m.kind == "metadata" and m.receiver == SERVER and isinstance(m.payload, dict)
    }
    # what the coalition pools: the server's unmasking answers (self-mask shares, and the pairwise
    # seeds survivors reveal for a client declared dropped) + the colluding clients' own secrets
    b_sh, revealed = {}, {}
    for m in msgs:
        if m.kind == "share" and m.receiver == SERVER and isinstance(m.payload, dict):
            for d, raw in m.payload.get("pairwise", {}).items():
                revealed[(party_client(m.sender), int(d))] = bytes(raw)
            for u, raw in m.payload.get("self_mask", {}).items():
                b_sh.setdefault(int(u), []).append(Share.from_bytes(raw))
    for c in coalition:
        for owner, b in state[c].held.items():
            b_sh.setdefault(owner, []).append(b)
    removed = []
    for j in sorted(state):
        if j == victim:
            continue
        common = np.intersect1d(ids, blocks.get(j, ids), assume_unique=True)
        if not common.size:
            continue
        if j in coalition:
            seed = state[j].seeds.get(victim)
        else:
            seed = revealed.get((j, victim))
        if seed is None:
            continue
        m = ranked_mask(seed, sid["pairwise"], common.size, L, dtype)
        pos = np.searchsorted(ids, common)
        y[pos] = y[pos] - m if j > victim else y[pos] + m  # victim added +PRG for j > victim
        removed.append(f"pairwise({victim},{j})")
    b = _rebuild(b_sh.get(victim, []), t)
    if b is not None:
        y -= ranked_mask(b, sid["self"], ids.size, L, dtype)
        removed.append("self mask")
    if not proto.reveal_to_server and coalition:
        for sign, key in zip(
            (1, -1), output_mask_keys(proto._group_seed[coalition[0]], victim, proto.num_clients, binding)
        ):
            m = ring_mask(key, sid["output"], ids, L, dtype)
            y = y - m if sign > 0 else y + m
        removed.append("output mask")
    truth = state[victim].encoded
    # compare residues mod 2^b: words wider than the ring carry bits the wire never held
    residue = np.asarray(2**enc.ring_bits - 1, dtype=dtype)
    return {
        "recovered": float(np.mean((y & residue) == (truth & residue))),
        "chance": 2.0**-enc.ring_bits,
        "removed": removed,
        "estimate": y,
        "decoded": enc.decode(y),
        "truth": enc.decode(truth),
    }


def ckks_break(proto, tag: str, rnd: int, coalition: list[int], keys=None) -> dict[int, np.ndarray]:
    """(a) for shared-key CKKS.

    Each upload in the server's view that a coalition client's key ring ``keys`` (default: the in-process client 0's,
    ``proto._keys``) decrypts (all of them: one secret key).  Returns victim -> decrypted values.
    """
    from protocols.ckks import wire
    from protocols.ckks.fixed_point import client_codec
    from protocols.ckks.keys import context_chain
    from protocols.ckks.params import ChainParams
    from protocols.ckks.plan_message import plan_from_payload
    from protocols.ckks.seeded import upload_bytes, upload_ciphertext

    if not coalition:
        return {}
    keys = proto._keys if keys is None else keys
    scales = {  # the public plan's scale per context: a packed upload (seed || c0) does not carry it
        p.payload["encoding"]["fingerprint"]: plan_from_payload(p.payload["encoding"]["plan"]).scale
        for p in proto.transcript.view(SERVER)
        if p.tag == tag
        and p.round == rnd
        and isinstance(p.payload, dict)
        and "fingerprint" in p.payload.get("encoding", {})
    }
    out = {}
    for m in proto.transcript.view(SERVER):
        if (
            m.tag == tag
            and m.round == rnd
            and m.kind == "ciphertext"
            and m.receiver == SERVER
            and isinstance(m.payload, list)
            and party_client(m.sender) not in coalition
        ):
            key = keys.by_fingerprint(m.fingerprint)  # the colluding client's copy of that chain's key
            if key is None:
                continue
            chain = ChainParams("coalition", *context_chain(key.context))
            codec = client_codec(key.context, chain, proto.encryption)
            bodies = [wire.unframe(f) for f in m.payload]
            cts = [
                upload_ciphertext(chain, b, scales[m.fingerprint]) if len(b) == upload_bytes(chain) else b
                for b in bodies
            ]
            vals = [codec.decrypt(ct, chain).real for ct in cts]
            out[party_client(m.sender)] = np.concatenate(vals) if vals else np.zeros(0)
    return out


def key_collusion_bound(proto) -> int | None:
    """The most clients that, with the server, still cannot decrypt another client's upload.

    Shared-key ``ckks`` 0 (every client holds the secret key), ``ckks-mp`` ``t - 1`` (any ``t``
    clients' Shamir shares rebuild a client's share ``s_i``; ``n - 1`` for n-out-of-n), ``mask``
    ``t - 1`` of its Shamir threshold for ``n`` contributors (``t`` shares rebuild a self-mask
    seed); None in ``plain`` (no key: the server reads every upload).
    """
    mode = getattr(proto, "mode", "plain")
    if mode == "ckks":
        return 0
    if mode == "ckks-mp":
        return int(proto.threshold) - 1
    if mode == "mask":
        return proto.threshold_for(proto.num_clients) - 1
    return None


def ckks_mp_coalition_key(proto, victim: int, coalition: list[int]) -> tuple[np.ndarray, str]:
    """The coalition's best key (NTT form) for ``victim``'s ``ckks-mp`` upload, and how it was made.

    Built from the members' own key material only (module docstring, (a)).
    """
    held, ring = proto._clients, proto.ring
    if victim in coalition:
        return held[victim]._share, "the victim's own share s_v"
    t = int(proto.threshold)
    if t < proto.num_clients:
        active = coalition[:t]
        key = held[active[0]].threshold_key([victim], active)
        for j in active[1:]:
            key = ring.add(key, held[j].threshold_key([victim], active))
        return key, f"Lagrange interpolation of {len(active)} Shamir share(s) of s_v (threshold {t})"
    key = held[coalition[0]]._share
    for c in coalition[1:]:
        key = ring.add(key, held[c]._share)
    return key, f"sum of the {len(coalition)} coalition shares s_i (n-out-of-n: s_v is not among them)"


def ckks_mp_break(proto, tag: str, rnd: int, victim: int, coalition: list[int], values: np.ndarray, spec) -> dict:
    """(a) for multiparty CKKS.

    The coalition decrypts ``victim``'s upload (one block of ``values``, exchanged under ``spec``;
    ``c0`` as sent, ``c1`` public) with its best key (:func:`ckks_mp_coalition_key`) -- the
    upload is encrypted under the victim's own share ``s_v``.
    Returns ``{'abs_corr': |corr| of the decrypted coefficients with the victim's encoded
    plaintext, 'chance': 1/sqrt(used), that correlation's standard deviation for independent
    data, 'used': coefficients carrying data, 'exact': every decrypted coefficient lies within
    ``Delta / 2`` of the victim's encoded plaintext (its input read exactly), 'holds_key': the
    coalition holds the victim's share or exceeds the run's key collusion bound, 'key': how the
    key was made}``.  Without ``s_v`` the term ``c1 s_v`` stays uniformly random, so ``abs_corr`` is at
    chance.  With ``coalition = [victim]`` the decryption is exact (positive control).
    """
    from protocols.ckks_mp import encoding, encryption

    ring = proto.ring
    plan = proto.plan_of(tag, rnd)
    msg = next(
        m
        for m in proto.transcript.view(SERVER)
        if m.tag == tag
        and m.round == rnd
        and m.kind == "ciphertext"
        and m.sender == client_party(victim)
        and m.receiver == SERVER
    )
    ct = proto.upload_ciphertexts(msg, plan)[0]  # c0 as sent, c1 public
    key, how = ckks_mp_coalition_key(proto, victim, coalition)
    used = encoding.used_coefficients(plan, len(values))
    attack = np.array(encoding.crt_centered(ring, encryption.decrypt(ring, key, ct))[:used], dtype=np.float64)
    truth = np.array(
        encoding.crt_centered(ring, encoding.encode(ring, plan, encoding.quantize(values, plan)))[:used],
        dtype=np.float64,
    )
    error = np.abs(attack - truth)
    return {
        "abs_corr": float(abs(np.corrcoef(attack, truth)[0, 1])),
        "chance": float(1.0 / np.sqrt(used)),
        "used": used,
        "exact": bool(error.max() < 2 ** (plan.scale_bits - 1)),
        "holds_key": victim in coalition or len(coalition) > key_collusion_bound(proto),
        "key": how,
    }


def implied_isolation(proto, tag: str, rnd: int, coalition: list[int]) -> dict:
    """(b) Fraction of the blocks whose aggregate has exactly one non-coalition contributor.

    Counted over the blocks coalition clients receive; for those, aggregate minus own inputs = that client's value.
    """
    msgs = [m for m in proto.transcript.messages if m.tag == tag and m.round == rnd]
    uploaders = sorted(
        {party_client(m.sender) for m in msgs if m.receiver == SERVER and m.kind in ("plain", "ciphertext", "masked")}
    )
    blocks = {
        party_client(m.sender): set(np.asarray(m.payload["block_ids"]).tolist())
        for m in msgs
        if m.receiver == SERVER and m.kind == "metadata" and isinstance(m.payload, dict)
    }
    received = isolated = 0
    for m in msgs:
        r = party_client(m.receiver)
        if m.sender != SERVER or r not in coalition or m.kind not in ("plain", "ciphertext", "masked"):
            continue
        got = m.payload.get("block_ids") if isinstance(m.payload, dict) else None
        bids = np.arange(int(m.shape[0])) if got is None else np.asarray(got)
        for b in bids.tolist():
            others = [k for k in uploaders if k not in coalition and (k not in blocks or b in blocks[k])]
            received += 1
            isolated += len(others) == 1
    return {"blocks_received": received, "isolated": isolated, "fraction": isolated / received if received else 0.0}


# ----------------------------------------------------------------------------- the runner's attack
from attacks.audit import DECLARED_RELEASES  # noqa: E402
from attacks.base import Attack, AttackResult, View  # noqa: E402  (after the functions it wraps)


def _probe_mask(proto, coalition: list[int], late: bool) -> float:
    """Mean fraction of a non-coalition client's upload the coalition recovers.

    Measured on a probe exchange of the same protocol settings (random inputs; the break does not depend on data).
    """
    from protocols.mask import MaskProtocol

    probe = MaskProtocol(
        proto.num_clients,
        reveal_to_server=proto.reveal_to_server,
        dropout_recovery=proto.dropout_recovery,
        threshold=proto.threshold,
    )
    probe.keep_client_state = True
    victims = [k for k in range(proto.num_clients) if k not in coalition]
    if not victims or proto.num_clients < 3:
        return float("nan")
    if late:
        probe.drop_clients([victims[0]], stage="late")
    rng = np.random.default_rng(0)
    probe.weighted_sum("probe/x", 0, {k: rng.uniform(-1, 1, 512) for k in range(proto.num_clients)})
    return float(
        np.mean(
            [mask_break(probe, "probe/x", 0, v, coalition)["recovered"] for v in (victims[:1] if late else victims)]
        )
    )


def _probe_ckks_mp(proto, coalition: list[int]) -> dict | None:
    """(a) For ckks-mp: the coalition's decryption of the first non-coalition client's upload.

    Run on a probe exchange of the same parameters and threshold (random integers; fresh keys: the
    break does not depend on data or key values).  None when every client is in the coalition.
    """
    from protocols import ValueSpec, make_protocol

    victims = [k for k in range(proto.num_clients) if k not in coalition]
    if not victims:
        return None
    probe = make_protocol("ckks-mp", proto.num_clients, params=proto.params, threshold=proto.threshold)
    rng = np.random.default_rng(0)
    spec = ValueSpec(integer=True, max_abs=200, sum_max=200 * proto.num_clients)
    vals = {k: rng.integers(0, 200, 4096).astype(float) for k in range(proto.num_clients)}
    probe.weighted_sum("probe/x", 0, vals, spec=spec)
    return ckks_mp_break(probe, "probe/x", 0, victims[0], coalition, vals[victims[0]], spec)


class CoalitionAttack(Attack):
    """Server + c colluding clients (default c=1: client 0).

    (a) upload fraction read by breaking the protocol, (b) fraction of received blocks the aggregate isolates (see
    module docstring).
    """

    name = "coalition"
    exchange = "*"
    default_observer = "coalition:[server,0]"
    knowledge = ("public", "coalition_keys")

    def run(self, view: View, knowledge) -> AttackResult:
        """Measure (a) what the coalition reads by breaking the protocol, (b) what the aggregates isolate.

        (a) per mode as the module docstring says: decryption with the shared key (ckks), mask removal compared
        with the encoded input (mask, chance 2^-32), |correlation| of a probe decryption (ckks-mp); (b) for every mode.
        """
        keys = knowledge["coalition_keys"]
        proto, coalition = keys["protocol"], sorted(keys["clients"])
        if SERVER not in view.parties or not coalition:
            return self.not_applicable("the coalition needs the server and at least one client")
        mode = getattr(proto, "mode", "plain")
        bound = key_collusion_bound(proto)
        holds_key = bound is None or len(coalition) > bound
        tags = sorted(
            {
                m.tag
                for m in view.messages
                if m.receiver == SERVER
                and m.tag not in DECLARED_RELEASES
                and m.kind in ("plain", "ciphertext", "masked")
            }
        )
        per_tag, broken = {}, []
        for tag in tags:
            rnd = max(m.round for m in view.messages if m.tag == tag and m.receiver == SERVER)
            iso = implied_isolation(proto, tag, rnd, coalition)
            entry = {"implied_isolated_fraction": iso["fraction"], "blocks_received": iso["blocks_received"]}
            if mode == "ckks":
                ups = [
                    m
                    for m in view.messages
                    if m.tag == tag
                    and m.round == rnd
                    and m.receiver == SERVER
                    and m.kind == "ciphertext"
                    and party_client(m.sender) not in coalition
                ]
                read = ckks_break(proto, tag, rnd, coalition, keys.get("ckks_keys")) if ups and holds_key else {}
                entry["break_read_fraction"] = len(read) / len(ups) if ups and any(m.payload for m in ups) else None
            elif mode == "plain":
                entry["break_read_fraction"] = 1.0
            per_tag[tag] = entry
            if entry.get("break_read_fraction") is not None:
                broken.append(entry["break_read_fraction"])
        metrics = {
            "per_exchange": per_tag,
            "coalition_clients": coalition,
            "key_collusion_bound": bound,
            "coalition_holds_key": holds_key,
            "implied_isolated_fraction": max((e["implied_isolated_fraction"] for e in per_tag.values()), default=0.0),
        }
        chance = 0.0
        if mode == "mask":
            metrics["break_probe_recovered"] = _probe_mask(proto, coalition, late=False)
            metrics["break_late_upload_recovered"] = _probe_mask(proto, coalition, late=True)
            value = max(metrics["break_probe_recovered"], metrics["break_late_upload_recovered"])
            chance = 2.0**-32
        elif mode == "ckks-mp":
            probe = _probe_ckks_mp(proto, coalition)
            if probe is None:
                return self.not_applicable("every client is in the coalition: it holds the whole secret key")
            metrics["break_probe_abs_corr"] = probe["abs_corr"]
            metrics["break_probe_exact"] = probe["exact"]
            metrics["break_probe_key"] = probe["key"]
            return self.result(
                metric="break_probe_abs_corr", value=probe["abs_corr"], chance=probe["chance"], metrics=metrics
            )
        else:
            value = max(broken) if broken else None
        return self.result(metric="break_read_fraction", value=value, chance=chance, metrics=metrics)

    def score(self, result: AttackResult, truth) -> AttackResult:
        """The result as measured by :meth:`run` (its metrics need no ground truth)."""
        return result
