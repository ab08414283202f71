"""Exceptions raised by protocol objects.

Every error names the exchange (tag, round) and, where one is at fault, the client,
and says how to fix the input.  When any of them is raised nothing is aggregated.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: an exchange was refused.  Nothing was aggregated."""

    def __init__(self, message: str, *, tag: str | None = None, round: int | None = None, client: int | None = None):
        where = []
        if tag is not None:
            where.append(f"exchange '{tag}'")
        if round is not None:
            where.append(f"round {round}")
        if client is not None:
            where.append(f"client {client}")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)
        self.tag, self.round, self.client = tag, round, client


class ConfigurationError(ProtocolError):
    """A protocol was built or called with settings it cannot honour."""


class ShapeError(ProtocolError):
    """A contribution has the wrong shape or dtype for this exchange."""


class NonFiniteError(ProtocolError):
    """A contribution holds NaN or inf."""


class BoundError(ProtocolError):
    """A value lies outside the public range the encoding can carry exactly.

    CKKS headroom or precision, quantisation range, packed field width.
    """


class PackingOverflowError(BoundError):
    """A packed integer field would overflow into its neighbour after the K-way sum."""


class IntegrityError(ProtocolError):
    """A message does not belong to this exchange or is corrupted.

    A message does not belong to this exchange: wrong protocol, context fingerprint,
    round or tag, or its bytes are truncated or corrupted.
    """


class DropoutError(ProtocolError):
    """A client left mid-exchange and its contribution cannot be recovered."""

    #: the clients that dropped (set by the raising server half)
    clients: tuple[int, ...]


class PrivacyBudgetError(ProtocolError):
    """A DP release was requested that the configured budget does not cover."""


class MalformedMessageError(IntegrityError):
    """A message's bytes do not parse: truncated, trailing garbage, a bad length or field."""


class DigestError(IntegrityError):
    """A message body does not match the SHA-256 digest its sender signed (changed in transit)."""


class AuthenticationError(IntegrityError):
    """A message's signature or sender does not check out.

    A message's signature does not verify under its claimed sender's registered key,
    or the sender it names is not the party expected in this slot (spoofing).
    """


class KeySubstitutionError(AuthenticationError):
    """A relayed public key is not signed by its owner's identity key.

    A relayed public key is not signed by the identity key of the party it belongs to
    (the relaying server substituted or changed it).
    """


class ReplayError(IntegrityError):
    """A message was seen before or belongs to another session or exchange.

    A message was seen before (same session, exchange, stage, sender, part), or belongs to
    another session or an earlier exchange of this one.
    """


class MisdirectedError(IntegrityError):
    """A message addressed to another recipient was delivered here."""


class UnmaskingRefusedError(ProtocolError):
    """An honest client refused an unmasking request that would reveal an input.

    An honest client refused an unmasking request that would reveal an individual input
    (both the self-mask and the mask-key shares of one client).
    """


class PlanRefusedError(ProtocolError):
    """A client refused the server's plan of an exchange before contributing.

    The plan breaks a rule every client checks (:mod:`protocols.plan_policy`).
    """


class TooFewContributorsError(PlanRefusedError):
    """The plan sums over fewer contributors than the run's minimum.

    A sum over one or two clients hands a colluding recipient the others' inputs.
    """


class RepeatedContributionError(PlanRefusedError):
    """The plan asks a client to contribute twice to the same (round, tag).

    The plan asks a client to contribute a second time to the same (round, tag): two sums over
    different contributor sets differ by individual inputs.
    """


class RecipientRoleError(PlanRefusedError):
    """The plan's recipients are not consistent with the public roles.

    Another recipient's request shown to this client, or a recipient that is not a client of the run.
    """


class ScheduleRoleError(RecipientRoleError):
    """The plan breaks the role the run's public schedule gives its tag.

    For example, a broadcast sent to this client in part only.
    """


class SampleMismatchError(PlanRefusedError):
    """The plan's contributors are not within the round's client sample.

    Every client recomputes the sample from the run manifest's sampling seed (:mod:`protocols.client_sampling`).
    """


class ContributorSetMismatchError(PlanRefusedError):
    """Exchanges of one related-input group in one round sum over different contributor sets.

    Two sums of related inputs (one local update in two tags) over sets that differ by one client
    would difference that client's input (:mod:`protocols.schedule`, ``groups``).
    """


class UnlistedExchangeError(PlanRefusedError):
    """A plan for a (round, tag) the run's public schedule does not list.

    Every client derives the exchanges of the run from its public configuration (the run manifest's
    ``exchanges``, :mod:`protocols.schedule`); the server asked for a sum the algorithm never makes.
    """


class ClearReportRefusedError(PlanRefusedError):
    """A report plan for a tag the owner did not mark as reported in the clear.

    A report plan (a value sent in the clear) for a tag this client's owner did not mark as
    reported in the clear: the server asked for a protected contribution through the report stage.
    """


class ThresholdRefusedError(PlanRefusedError):
    """A mask plan names a Shamir threshold the run does not allow.

    A mask plan names a Shamir threshold other than the one the run's public setup gives, or
    one the run's colluders could meet on their own.
    """


class ModulusPlanError(PlanRefusedError):
    """A ckks-mp plan names moduli other than the ones every client computes from the exchange's public facts.

    Its upload level, switch level, scale or packing differ from :func:`protocols.ckks_mp.params.plan_exchange`'s for
    the exchange's bounds, client count and key switch (to each recipient's key, or to the broadcast key), or its
    switch is malformed: a server could otherwise have clients answer at a level sized for a smaller noise than
    the switch it then asks for.
    """


class ShareIntegrityError(IntegrityError):
    """A revealed Shamir share does not match its dealer's signed commitment.

    A Shamir share revealed for unmasking does not match the commitment its dealer signed:
    the client that sent it (named) corrupted it.
    """


class KeySwitchRefusedError(ProtocolError):
    """A ckks-mp client refused a key-switching request.

    Answering it could re-encrypt what it holds to a key the run does not name, for blocks or a recipient the plan
    does not release, or past the run's smudging budget.
    """


class RecipientKeyError(KeySwitchRefusedError):
    """A key switch names a recipient key that is not the exchange's.

    A key switch names a recipient key that is not the owner-signed key of a recipient of
    this exchange (or the dealer-signed broadcast key where the plan releases the blocks to all).
    """


class DowngradeError(KeySwitchRefusedError):
    """A key switch or download would send blocks scoped to one recipient to the broadcast key."""


class RepeatedKeySwitchError(KeySwitchRefusedError):
    """A second key-switching request in one exchange."""


class UnplannedKeySwitchError(KeySwitchRefusedError):
    """A ckks-mp key-switching batch holds a (key, block) pair the exchange's planned switch does not."""


class NoiseAllowanceError(UnmaskingRefusedError, KeySwitchRefusedError):
    """A client refused to release a sum that misses more contributors than its DP noise allows.

    With distributed DP each of a plan's ``n`` contributors adds a noise share sized so that the sum
    keeps ``sigma`` when at most ``d`` (``--dp-dropouts``, from the run's own config) are missing; an
    honest client unmasks (mask) or key-switches (t-out-of-n ckks-mp) only a sum over at least
    ``n - d`` of them, whatever the server declares dropped.
    """


class ActiveSetError(KeySwitchRefusedError):
    """A t-out-of-n key switch names an active set or uploader set the plan does not allow.

    A t-out-of-n ckks-mp key switch names an active set that is not exactly ``t`` distinct
    clients of the run including this one, or an uploader set the plan does not allow (a
    non-contributor, this client's own upload misreported, more uploads missing than n - t, one
    block with two uploader sets), or a batch names another active set than its switch's.
    """


class SmudgingBudgetError(KeySwitchRefusedError):
    """The run's key switches would exceed the public smudging budget.

    The run's key switches would exceed the public budget that keeps the smudging's total
    statistical distance within 2^-30.
    """


class ConsistencyError(UnmaskingRefusedError):
    """A mask client refused to unmask an inconsistent survivor set.

    A mask client refused to unmask: the server's survivor set is not the one this client
    signed in the consistency round, or fewer than ``t`` survivors signed it (the server told
    different clients different survivor sets).
    """


class InconsistentViewError(ConsistencyError, IntegrityError):
    """The clients of one exchange do not hold one view of it.

    The server told them different survivor sets or plans, or sent them different broadcasts to train on (a
    model-inconsistency attack, :mod:`protocols.broadcast_view`). Nothing was revealed.
    """


class RepeatedUploadError(ProtocolError):
    """A second upload request in one exchange.

    Ckks-mp: the second ciphertext would share the first one's public ``c1``, so their difference would reveal the
    difference of the inputs.
    """
