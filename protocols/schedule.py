r"""The data-independent part of a run's exchange schedule.

Every client half reads it from the run manifest and checks each plan against it.

The manifest's ``security`` section carries (:mod:`protocols.manifest`):

* ``exchanges``: tag -> ``[first, last]``, the rounds in which the run's algorithm may plan an
  exchange under that tag, derived by every party from the public configuration (the algorithm's
  :attr:`~secure_fgl.algorithms.spec.AlgorithmSpec.schedule`).  A client refuses, in every mode
  and before anything is sent, a plan whose (round, tag) it does not list:
  :class:`~protocols.errors.UnlistedExchangeError`.  (Without the field nothing is listed and no
  plan is refused for its tag: protocol-level tests and attack simulations that drive a backend
  directly.)
* ``sample_seed`` and ``client_fraction``: the round's sample ``S_r``
  (:func:`protocols.client_sampling.sample_clients`);
* ``roles``: tag -> public role of the exchanges under that tag.  First,
  :data:`BROADCAST`: the exchange of a model every client trains on (FedAvg's ``<algorithm>/model``).
  For a tag with that role a client refuses (nothing is sent) a plan

  1. whose contributors are not within the round's sample ``S_r`` (dropouts only remove
     clients): :class:`~protocols.errors.SampleMismatchError`;
  2. that gives it, as a recipient, anything but every block of the sum (a broadcast reaches
     every recipient whole and alike): :class:`~protocols.errors.ScheduleRoleError`;

  and binds the digest of every broadcast it received under the tag into what it contributes
  next under it (:mod:`protocols.broadcast_view`), so clients that were sent different models
  cannot complete a sum together.  A second role, :data:`RELEASE`: a sum whose recipients get
  different rows (FedGCN's pre-training neighbour sums, fedgcn-gap's hop sums).  The server sends
  each recipient a proof that its rows are part of one committed sum (``mask``: of the blocks'
  wire bytes; ``ckks-mp``: of the recipients' keyed digests of what they decoded, one stage
  later); the recipient refuses rows without a valid one
  (:class:`~protocols.errors.InconsistentViewError`, nothing delivered) and binds the commitment
  into every later contribution (:mod:`protocols.release_commitment`); in ``mask``, once it holds
  one, every survivor must sign the survivor set of a later release (fedgcn-gap's hop ``h + 1``,
  computed from hop ``h``'s rows).  A third role, :data:`STATISTIC`: a sum every recipient of the round's
  sample gets whole and uses in that round only (FedOMD's pooled statistics).  It is checked as a
  broadcast (rules 1 and 2); its contributions bind the client's chains of every broadcast (they
  are computed on the models received), and in ``mask`` each one received is chained into the
  round's view ``w_r``, bound into every later contribution of the round
  (:mod:`protocols.broadcast_view`).
* ``groups``: lists of tags whose exchanges carry the same input (FedSpray's batch holds the
  encoder's vector of one local update, and the proxies'; a tag may be in several groups).  In
  ``mask`` and ``ckks-mp`` a client contributes to the members of a group in one round only over
  one contributor set: the set its first contribution of the group was released over (``mask``:
  the survivor set it signed), else :class:`~protocols.errors.ContributorSetMismatchError`, nothing
  sent: two sums over sets that differ by one client would difference that client's input
  (:class:`~protocols.plan_policy.PlanPolicy` checks the same for repeats of one tag).

A listed tag without a role is checked by the run-wide rules only (:mod:`protocols.plan_policy`).
A party without a manifest (trust on first use) has no schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .client_sampling import sample_clients
from .errors import ConfigurationError, SampleMismatchError, ScheduleRoleError, UnlistedExchangeError
from .plan import ExchangePlan

#: the role of a model broadcast every client trains on (module docstring)
BROADCAST = "broadcast"
#: the role of a sum released as different rows to different recipients, bound by the server's
#: commitment to the whole sum (:mod:`protocols.release_commitment`)
RELEASE = "release"
#: the role of a sum the round's sample receives whole and uses in that round only (module docstring)
STATISTIC = "statistic"
ROLES = (BROADCAST, RELEASE, STATISTIC)


@dataclass(frozen=True)
class PublicSchedule:
    """What a client knows of the schedule before any plan: sampling and each listed tag's role."""

    num_clients: int
    sample_seed: int = 0
    client_fraction: float = 1.0
    roles: dict[str, str] = field(default_factory=dict)
    #: tag -> (first, last) round of its exchanges; ``None``: nothing listed, no tag refused
    exchanges: dict[str, tuple[int, int]] | None = None
    #: tag -> the related-input groups it belongs to (module docstring), each the group's sorted tags
    groups: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, num_clients: int, security: dict[str, Any]) -> PublicSchedule:
        """The schedule in a manifest's ``security`` section (missing fields: every client each round, no roles)."""
        roles = dict(security.get("roles") or {})
        bad = {tag: role for tag, role in roles.items() if role not in ROLES}
        if bad:
            raise ConfigurationError(f"unknown exchange roles {bad} in the run manifest; known roles: {list(ROLES)}")
        listed = security.get("exchanges")
        try:
            exchanges = None if listed is None else {str(t): (int(a), int(b)) for t, (a, b) in dict(listed).items()}
            groups = [tuple(sorted(str(t) for t in group)) for group in security.get("groups") or []]
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"malformed exchange listing in the run manifest ({e})") from None
        group_of = {tag: tuple(g for g in groups if tag in g) for group in groups for tag in group}
        return cls(
            int(num_clients),
            int(security.get("sample_seed", 0)),
            float(security.get("client_fraction", 1.0)),
            roles,
            exchanges,
            group_of,
        )

    def lists(self, tag: str, rnd: int) -> bool:
        """Whether the schedule allows an exchange under ``tag`` in round ``rnd`` (nothing listed: every one)."""
        if self.exchanges is None:
            return True
        span = self.exchanges.get(tag)
        return span is not None and span[0] <= int(rnd) <= span[1]

    def check_listed(self, plan: ExchangePlan, client: int) -> None:
        """Refuse ``plan`` if its (round, tag) is not an exchange of the run (module docstring)."""
        if not self.lists(plan.tag, plan.round):
            span = (self.exchanges or {}).get(plan.tag)
            listed = f"lists {plan.tag!r} for rounds {span[0]}..{span[1]} only" if span else f"has no {plan.tag!r}"
            raise UnlistedExchangeError(
                f"the run's public schedule {listed}, but the server plans it in round {plan.round}: refused, "
                "nothing was sent (an algorithm lists its exchanges in its AlgorithmSpec.schedule)",
                tag=plan.tag,
                round=plan.round,
                client=client,
            )

    def releases(self, tag: str) -> bool:
        """Whether ``tag``'s sum is released as rows under a commitment (:data:`RELEASE`)."""
        return self.roles.get(tag) == RELEASE

    def commits_decoded(self, tag: str) -> bool:
        """Whether ``ckks-mp`` delivers ``tag``'s result only under a commitment to what its recipients decoded.

        A :data:`RELEASE` or a :data:`STATISTIC`: each recipient reports a keyed digest of every block it decoded,
        the server sends every client the root over them (:mod:`protocols.release_commitment`), and every client
        chains the root into the digest it binds into every later contribution.
        """
        return self.roles.get(tag) in (RELEASE, STATISTIC)

    def binds_views(self, tag: str) -> bool:
        """Whether contributions under ``tag`` bind the broadcasts received under it."""
        return self.roles.get(tag) == BROADCAST

    def is_statistic(self, tag: str) -> bool:
        """Whether ``tag``'s sum is a statistic of the round's sample (:data:`STATISTIC`)."""
        return self.roles.get(tag) == STATISTIC

    def every_survivor_signs(self, tag: str) -> bool:
        """Whether every survivor signs the survivor set of a ``tag`` exchange (its view is checked).

        A broadcast or a statistic (``mask``, :mod:`protocols.broadcast_view`); a release once
        the client holds a commitment is checked by the client itself.
        """
        return self.roles.get(tag) in (BROADCAST, STATISTIC)

    def groups_of(self, tag: str) -> tuple[tuple[str, ...], ...]:
        """The related-input groups of ``tag`` (module docstring); empty: in none."""
        return self.groups.get(tag, ())

    def sample(self, rnd: int) -> list[int]:
        """The clients sampled in round ``rnd`` (a public function of the sample seed)."""
        return sample_clients(self.sample_seed, rnd, self.num_clients, self.client_fraction)

    def check(self, plan: ExchangePlan, client: int) -> None:
        """Refuse ``plan`` if it breaks the role the schedule gives its tag (module docstring)."""
        if self.roles.get(plan.tag) not in (BROADCAST, STATISTIC):
            return
        outside = sorted(set(plan.contributors) - set(self.sample(plan.round)))
        if outside:
            raise SampleMismatchError(
                f"the plan's contributors include {outside}, who are not in round {plan.round}'s sample "
                f"{self.sample(plan.round)} (the run manifest's sampling seed and client fraction): refused, "
                "nothing was sent",
                tag=plan.tag,
                round=plan.round,
                client=client,
            )
        own = plan.requests.get(client)
        if own is not None and not np.array_equal(np.sort(own), np.arange(plan.num_blocks)):
            raise ScheduleRoleError(
                f"the public schedule makes {plan.tag!r} a {self.roles[plan.tag]} (every recipient gets every block), "
                f"but this client is sent {np.asarray(own).size} of {plan.num_blocks} blocks: refused",
                tag=plan.tag,
                round=plan.round,
                client=client,
            )
