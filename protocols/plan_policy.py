r"""The checks every client half makes on the server's plan of an exchange, before contributing.

A server that deviates from the protocol chooses who contributes to a sum and who receives it.
Without a check it reads any input in one exchange: a sum whose only contributor is the victim,
delivered to a colluding client, is the victim's input; two sums over contributor sets that
differ by one client differ by that client's input.  Each client therefore refuses (a
:class:`~protocols.errors.PlanRefusedError` subclass; nothing is sent) a plan that

1. sums over fewer than ``min_contributors`` contributors (default ``c + 2`` for a run that
   tolerates ``c`` clients colluding with the server: every sum it joins covers at least two
   honest contributors, so a coalition that subtracts its own inputs is left with a sum of at
   least two honest ones);
2. asks it to contribute again to a (round, tag) it already contributed to, unless the two
   contributor sets ``S`` (now) and ``S'`` (before) differ by at least ``min_contributors`` clients
   on each side that differs: ``sum(S') - sum(S) = sum(S' \ S) - sum(S \ S')``, so each non-empty
   side must itself be a sum the run allows.  The same set again is refused too (the server could
   leave out a different contributor each time).  GCFL's split round (the cluster's sum, then each
   half's) passes when each half has at least ``min_contributors`` members;
3. shows it another recipient's request, or names a recipient that is not a client of the run;
4. (``mask`` and ``ckks-mp``) asks it to contribute, in a round, to a tag of a related-input group
   of the public schedule (:mod:`protocols.schedule`, ``groups``: FedSpray's batch carries the
   encoder's vector of one local update, and the proxies') over another contributor set than the
   one its first contribution of the group in that round was released over (:meth:`PlanPolicy.released_over`:
   ``mask``'s signed survivor set, ``ckks-mp``'s uploaders):
   :class:`~protocols.errors.ContributorSetMismatchError`.

``c`` and the minimum are public run parameters (:class:`CollusionBound`, read from the party
setup by :func:`collusion_bound`), never taken from a plan.  A sum over ``m >= c + 2``
contributors still reveals, to its recipients, the sum of the ``m - c`` honest inputs: the
aggregate is the output by design (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import (
    ConfigurationError,
    ContributorSetMismatchError,
    RecipientRoleError,
    RepeatedContributionError,
    TooFewContributorsError,
)
from .plan import ExchangePlan


@dataclass(frozen=True)
class CollusionBound:
    """The run's collusion bound and minimum contributors.

    ``max_colluders`` (c): clients that may collude with the server; ``min_contributors``:
    the fewest contributors of any sum a client joins (``>= c + 2``).
    """

    max_colluders: int = 0
    min_contributors: int = 2

    @classmethod
    def of(cls, max_colluders: int = 0, min_contributors: int | None = None) -> CollusionBound:
        """Checked bound; ``min_contributors=None``: ``c + 2``."""
        c = int(max_colluders)
        if c < 0:
            raise ConfigurationError(f"max_colluders must be >= 0, got {max_colluders} (--max-colluders)")
        m = c + 2 if min_contributors is None else int(min_contributors)
        if m < c + 2:
            raise ConfigurationError(
                f"min_contributors={m} is below max_colluders + 2 = {c + 2}: a sum could then "
                "hold a single honest input beside the colluders' own. Fix: "
                f"--min-contributors >= {c + 2} or a smaller --max-colluders"
            )
        return cls(c, m)

    def to_dict(self) -> dict:
        """The bound as a plain dict."""
        return {"max_colluders": self.max_colluders, "min_contributors": self.min_contributors}


def collusion_bound(setup) -> CollusionBound:
    """The run's collusion bound from its public setup (the one accessor every half uses)."""
    return setup.collusion


@dataclass
class PlanPolicy:
    """One client's plan checks and what it remembers between exchanges.

    It remembers the (round, tag) pairs it has contributed to.
    """

    client: int
    num_clients: int
    bound: CollusionBound
    #: (round, tag) -> the contributor sets of the sums this client joined under it
    contributed: dict = field(default_factory=dict)
    #: (round, group) -> (the tag of the group's first contribution, the set it was released over)
    group_sets: dict = field(default_factory=dict)

    def check(self, plan: ExchangePlan, groups: dict[str, tuple[tuple[str, ...], ...]] | None = None) -> None:
        """Refuse ``plan`` (module doc, rules 1-4; ``groups``: tag -> its related-input groups); record it."""
        where = dict(tag=plan.tag, round=plan.round, client=self.client)
        if set(plan.requests) - {self.client} or any(not 0 <= r < self.num_clients for r in plan.requests):
            raise RecipientRoleError(
                "the plan shows this client another recipient's request, or a recipient that "
                "is not a client of the run",
                **where,
            )
        if self.client not in plan.contributors:
            return
        if len(set(plan.contributors)) != len(plan.contributors) or any(
            not 0 <= k < self.num_clients for k in plan.contributors
        ):
            raise RecipientRoleError(
                f"the plan's contributors {list(plan.contributors)} are not distinct clients of the run", **where
            )
        if len(plan.contributors) < self.bound.min_contributors:
            raise TooFewContributorsError(
                f"the plan sums over {len(plan.contributors)} contributor(s), fewer than the run's minimum of "
                f"{self.bound.min_contributors} (--min-contributors; max colluders c={self.bound.max_colluders}): "
                "refused, nothing was sent",
                **where,
            )
        key, now, m = (int(plan.round), plan.tag), frozenset(plan.contributors), self.bound.min_contributors
        for before in self.contributed.get(key, []):
            sides = (len(before - now), len(now - before))
            if now == before or any(0 < side < m for side in sides):
                raise RepeatedContributionError(
                    f"this client already contributed to this (round, tag) with {sorted(before)}; a sum over "
                    f"{sorted(now)} would differ from it by fewer than {m} clients' inputs: refused, nothing was "
                    "sent",
                    **where,
                )
        for group in (groups or {}).get(plan.tag, ()):
            self.released_over(plan, group, now)
        self.contributed.setdefault(key, []).append(now)

    def released_over(self, plan: ExchangePlan, group: tuple[str, ...], included) -> None:
        """Rule 4: the contributors ``included`` in ``plan``'s sum, a tag of related-input group ``group``.

        The first contribution of the group in the round records its set (first the plan's contributors, then
        the set its sum was released over, which the backend reports); any other tag of the group in that round
        must name the same set (ContributorSetMismatchError otherwise, nothing sent).
        """
        key, now = (int(plan.round), group), frozenset(int(k) for k in included)
        first = self.group_sets.get(key)
        if first is None or first[0] == plan.tag:
            self.group_sets[key] = (plan.tag, now)
        elif now != first[1]:
            raise ContributorSetMismatchError(
                f"{plan.tag!r} and {first[0]!r} carry related inputs (one group of the run's public schedule), "
                f"but this round's {first[0]!r} sum was released over {sorted(first[1])} and this one covers "
                f"{sorted(now)}: the two sums would difference the clients in one and not the other; refused "
                "before anything more of this exchange is sent (upload, survivor-set signature, key-switching share)",
                tag=plan.tag,
                round=plan.round,
                client=self.client,
            )
