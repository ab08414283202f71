r"""What a run's differential privacy protects: the unit, the budget, every release.

A DP run names its **unit of privacy** (``--dp-unit``):

* ``edge``   -- neighbouring graphs differ in one edge (u, v);
* ``node``   -- one node, its features, label and edges (degree capped by ``--degree-cap``; GAP: the
  number of hop sums a node enters bounded by ``--max-degree``);
* ``client`` -- one client's whole contribution (DP-FedAvg, McMahan et al., ICLR 2018);
* ``sample`` -- one training record as a training example (DP-SGD: a node of a node-wise
  model, a graph of a graph classifier).

Units nest: a release that is client-level DP is also node-, sample- and edge-level DP (one
client holds the node, record or edge); a node-level release is also edge- and sample-level.  A run is ``unit``-level
DP with the reported ``(total_epsilon, delta)`` when every release that depends on data the
unit protects is privatised at that unit or a coarser one; everything else the clients
release is post-processing of DP releases or of data the unit does not protect.  The run's
``privacy`` section (:func:`privacy_section`) lists every release (tag), the data it
touches, the unit its noise covers and its epsilon, and names in ``uncovered`` each release
that breaks the claim (e.g. FedGCN's GCN layers propagate over exact local edges, so under
an edge-level claim its model exchange must be privatised too, or the claim is false).

Budget (``--dp-epsilon``, ``--dp-budget-share``, ``--dp-accountant``): ``epsilon`` is the total for
the run; tags share it as shares of the Gaussian-DP budget ``mu^2`` (:mod:`protocols.dp`,
"Calibration"), so the run spends what was asked.  The default accountant ``exact`` composes
the unsampled Gaussian releases exactly (analytic Gaussian of the composed mu).

Client-level DP with few clients: the mean of K clipped updates has norm <= C while its
noise has norm ~ z C sqrt(d) / K (d parameters).  The section stores this
``noise_to_signal`` ratio per client-level release and a warning when it exceeds 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from protocols.accountant import epsilon_of
from protocols.dp import SECURE_MODES, DPConfig

from .validation import ConfigError

if TYPE_CHECKING:
    from .config import RunConfig

#: the units a release privatised at a given unit also protects
COVERS = {
    "client": {"client", "node", "edge", "sample"},
    "node": {"node", "edge", "sample"},
    "edge": {"edge"},
    "sample": {"sample"},
}
#: tags of evaluation reports (:data:`secure_fgl.runtime.strategy.EVAL_TAG`)
EVALUATION_PREFIX = "eval/"
#: the data each unit protects (a release touching any of it must be privatised)
PROTECTS = {
    "edge": {"edges"},
    "node": {"features", "labels", "edges"},
    "client": {"features", "labels", "edges"},
    "sample": {"features", "labels", "edges"},
}


def row_sum_tags(cfg: RunConfig) -> tuple[str, ...]:
    """Tags of the run's neighbour-sum (``row_sum``) exchanges, whose noise is edge- or node-level."""
    if cfg.algorithm == "fedgcn" and int(cfg.options.get("hops", 1)) > 0:
        return ("fedgcn/neighbour_sums",)
    if cfg.algorithm in ("fedgcn-gap", "gap"):  # gap: the same hops on one party
        return ("fedgcn-gap/hop",)
    return ()


def resolve_unit(cfg: RunConfig) -> str:
    """The DP unit: ``--dp-unit``, else the algorithm's default.

    ``--dp-unit``, else edge for algorithms with a neighbour-sum exchange, sample for DP-SGD
    alone (``--dpsgd``), else client.
    """
    if cfg.dp_unit is not None:
        return cfg.dp_unit
    if row_sum_tags(cfg):
        return "edge"
    return "sample" if cfg.options.get("dpsgd") else "client"


def parse_scope(cfg: RunConfig) -> tuple[str, ...]:
    """The exchanges DP covers (``--dp-exchanges``): empty for ``all``, else the listed tag prefixes."""
    return () if cfg.dp_exchanges == "all" else tuple(t.strip() for t in cfg.dp_exchanges.split(",") if t.strip())


def parse_budget_shares(text: str | None) -> dict[str, float] | None:
    """``'tag=share,tag=share'`` -> ``{tag: share}`` (each exchange's relative share of the DP budget)."""
    if not text:
        return None
    out = {}
    for part in text.split(","):
        tag, sep, share = part.partition("=")
        try:
            out[tag.strip()] = float(share)
        except ValueError:
            sep = ""
        if not sep or not tag.strip() or not out[tag.strip()] > 0:
            raise ConfigError(
                f"--dp-budget-share takes tag=share,... with positive shares, got {part!r} "
                "(e.g. fedgcn/neighbour_sums=3,fedgcn/model=1)"
            )
    return out


def _in_scope(scope: tuple[str, ...], tag: str) -> bool:
    return not scope or any(tag == p or tag.startswith(p.rstrip("/") + "/") or p.startswith(tag) for p in scope)


def dp_config(cfg: RunConfig):
    """The run's :class:`protocols.dp.DPConfig` (``None`` without DP); refuses conflicting settings."""
    if cfg.dp_epsilon is None:
        return None
    unit, scope, shares = resolve_unit(cfg), parse_scope(cfg), parse_budget_shares(cfg.dp_budget_share)
    sums = [t for t in row_sum_tags(cfg) if _in_scope(scope, t)]
    if unit == "client" and sums:
        raise ConfigError(
            f"--dp-unit client cannot privatise the neighbour-sum exchange {sums[0]} (one client's "
            "rows have no client-level bound): use --dp-unit edge|node, or --dp-exchanges "
            f"{cfg.algorithm}/model"
        )
    if sums and unit in ("edge", "node") and cfg.algorithm == "fedgcn" and _in_scope(scope, "fedgcn/model"):
        raise ConfigError(
            "fedgcn's GCN propagates over exact local edges, so its model exchange would need client-level "
            "noise, which drowns the updates of a federation's clients (it trains to chance): use "
            "--algorithm fedgcn-gap for edge-level DP that learns"
        )
    if unit == "sample" and (sums or not cfg.options.get("dpsgd")):
        raise ConfigError(
            "--dp-unit sample is DP-SGD's unit (one training record): it needs --dpsgd, and an "
            "algorithm with neighbour sums states their edge/node unit (fedgcn-gap --dpsgd: "
            "--dp-unit edge)"
        )
    if shares is not None:
        out = [t for t in shares if scope and not _in_scope(scope, t)]
        if out:
            raise ConfigError(
                f"--dp-budget-share names {out[0]}, which --dp-exchanges {cfg.dp_exchanges} leaves "
                "without DP; give shares to privatised exchanges only"
            )
    return DPConfig(
        epsilon=cfg.dp_epsilon,
        delta=cfg.dp_delta,
        placement=resolve_placement(cfg),
        scope=scope,
        budget_shares=shares,
        accountant=cfg.dp_accountant,
        dropouts=cfg.dp_dropouts,
        colluders=cfg.dp_colluders,
        exchange_releases=unit != "sample",
    )


def resolve_placement(cfg: RunConfig) -> str:
    """``--dp-placement``; ``auto``: distributed where only recipients see the sums (secure modes), else local."""
    if cfg.dp_placement != "auto":
        return cfg.dp_placement
    return "distributed" if cfg.mode in SECURE_MODES else "local"


def _released_tags(protocol) -> list[str]:
    """Tags of every exchange whose values left a client, in first-release order.

    Key set-up tags, ``*/keys`` such as ``auth/keys`` and ``ckks/keys``, carry key material, no data; evaluation
    counts, ``eval/*``, are the run's reported metrics -- recorded as messages by the client runtimes, released as
    ``result.json`` by every run -- and are not training releases.
    """
    seen = []
    for m in protocol.transcript.messages:
        if (
            m.sender.startswith("client")
            and m.tag not in seen
            and not m.tag.endswith("/keys")
            and not m.tag.startswith(EVALUATION_PREFIX)
        ):
            seen.append(m.tag)
    return seen


def release_dependencies(algo, tag: str) -> set[str]:
    """The private data a release of ``tag`` is computed from.

    ``algo.release_dependencies()`` when the algorithm states it, else the conservative answer (all of it; an MLP
    model exchange without a neighbour-sum exchange touches no edge).
    """
    stated = getattr(algo, "release_dependencies", None)
    if stated is not None:
        for prefix, deps in stated().items():
            if tag == prefix or tag.startswith(prefix.rstrip("/") + "/"):
                return set(deps)
    cfg = algo.cfg
    if tag.endswith("/model") and cfg.model == "mlp" and not row_sum_tags(cfg):
        return {"features", "labels"}
    return {"features", "labels", "edges"}


def privacy_section(cfg: RunConfig, algo, protocol) -> dict | None:
    """The ``privacy`` section of ``result.json`` (``None`` without DP); see the module docstring."""
    rep = protocol.privacy_report()
    if rep is None:
        return None
    unit, sums = resolve_unit(cfg), row_sum_tags(cfg)
    per_tag = rep.get("per_tag", {})
    params = getattr(algo, "global_params", None)
    dim = int(params.numel()) if params is not None else getattr(algo, "model_size", None)
    num_clients = getattr(algo, "num_clients", None) or len(algo.clients)  # a runtime strategy / an algorithm
    releases, uncovered, warnings = [], [], []
    local_units = getattr(algo, "release_units", dict)()  # releases a client makes alone (DP-SGD steps)
    exchanged = _released_tags(protocol)
    for tag in exchanged + [t for t in per_tag if t not in exchanged]:
        deps = release_dependencies(algo, tag)
        entry = {"tag": tag, "touches": sorted(deps), "dp": tag in per_tag}
        if tag in local_units and tag in per_tag:
            t = per_tag[tag]
            shares = int(t.get("noise_shares", 1))
            entry.update(
                {
                    "unit": local_units[tag],
                    "releases": t["releases"],
                    "noise_multiplier": t["noise_multiplier"],
                    "sensitivity": t.get("sensitivity"),
                    "epsilon": t["epsilon"],
                    "share": protocol.dp.share(tag),
                    "noise_shares": shares,
                    "note": "DP-SGD: protects a training node's features and label as a record of this model; "
                    "the model exchanges are post-processing of these noisy gradients; "
                    + (
                        f"each step's noise is split over {shares} clients' shares inside the secure "
                        "model mean (one SGD step per round)"
                        if shares > 1
                        else "each client adds all of each step's noise"
                    ),
                }
            )
            if "sample_rate" in t:  # Poisson-sampled DP-SGD (amplified accounting)
                entry["sample_rate"] = t["sample_rate"]
            covered = unit in COVERS[local_units[tag]] or not (deps & PROTECTS[unit])
            if shares == 1 and rep["placement"] == "distributed" and getattr(algo, "dpsgd_secure_mean", False):
                warnings.append(
                    f"{tag}: each client adds all of each DP-SGD step's noise (several local steps or "
                    "client sampling); --local-epochs 1 lets the secure model mean carry it, split over "
                    "the clients' noise shares"
                )
        elif tag in per_tag:
            t = per_tag[tag]
            rel_unit = unit if any(tag == s or tag.startswith(s) for s in sums) else "client"
            entry.update(
                {
                    "unit": rel_unit,
                    "releases": t["releases"],
                    "noise_multiplier": t["noise_multiplier"],
                    "sensitivity": t.get("sensitivity"),
                    "epsilon": t["epsilon"],
                    "share": protocol.dp.share(tag),
                }
            )
            covered = unit in COVERS[rel_unit]
            if rel_unit == "client" and dim and isinstance(t["noise_multiplier"], float):
                ratio = t["noise_multiplier"] * math.sqrt(dim) / max(1, num_clients)
                entry["noise_to_signal"] = ratio
                if ratio > 1:
                    warnings.append(
                        f"{tag}: client-level noise on the mean of {num_clients} clients has "
                        f"~{ratio:.3g}x the norm of the largest possible mean update ({dim} "
                        f"parameters); client-level DP needs about {math.ceil(ratio) * num_clients}"
                        " clients or more to learn (or fewer parameters). Edge-level DP that learns: "
                        "--algorithm fedgcn-gap (docs/dp.md)"
                    )
        else:
            covered = not (deps & PROTECTS[unit])
        entry["covered"] = covered
        if not covered:
            uncovered.append(
                f"{tag} is released {'with ' + entry['unit'] + '-level' if entry['dp'] else 'without'}"
                f" DP but touches {', '.join(sorted(deps & PROTECTS[unit]))}: the {unit}-level claim "
                "does not hold for it"
            )
        releases.append(entry)
    section_coalition = (
        coalition_guarantee(
            releases,
            sums,
            num_clients,
            rep["delta"],
            colluding=max(1, cfg.dp_colluders),
            calibrated=cfg.dp_colluders,
            dropouts=cfg.dp_dropouts,
            composition=rep.get("composition", "exact"),
        )
        if rep["placement"] == "distributed"
        else None
    )
    return {
        "unit": unit,
        "units": sorted({r["unit"] for r in releases if r.get("unit")}),
        "claim_holds": not uncovered,
        "total_epsilon": rep["total_epsilon"],
        "coalition": section_coalition,
        "epsilon_budget": rep["epsilon_budget"],
        "delta": rep["delta"],
        "accountant": rep["accountant"],
        "composition": rep.get("composition", rep["accountant"]),
        "placement": rep["placement"],
        "scope": cfg.dp_exchanges,
        "releases": releases,
        "uncovered": uncovered,
        "warnings": warnings,
        "per_tag": per_tag,
        "replayed_releases": rep.get("replayed_releases", 0),
        **({"degree_bound": algo.degree_bound()} if unit == "node" and hasattr(algo, "degree_bound") else {}),
    }


def coalition_guarantee(
    releases: list[dict],
    sums: tuple[str, ...],
    num_clients: int,
    delta: float,
    colluding: int = 1,
    calibrated: int = 0,
    dropouts: int = 0,
    composition: str = "exact",
) -> dict:
    """The guarantee of distributed noise against the server plus ``colluding`` clients.

    Distributed placement (:mod:`protocols.dp`) gives each of a sum's n contributors the noise
    variance ``sigma^2 / max(1, n - d - c)``, over-provisioned for ``d = dropouts`` and
    ``c = calibrated`` colluders.  A coalition of ``colluding`` clients subtracts its own shares;
    with ``h >= 1`` honest survivors the sum keeps ``h sigma^2 / max(1, n - d - c)`` (a sum with
    no honest survivor holds no honest data).  Worst case per release, as a fraction of sigma^2:
    dense exchanges (n = K): ``(K - d - colluding) / max(1, K - d - c)``; row sums (n per row,
    free): ``1 / (1 + max(0, colluding - c))`` (one honest survivor, n = 1 + colluding + d).
    Capped at 1; at ``colluding <= c`` nothing is lost.  The epsilon against the coalition composes
    the releases at their reduced noise multipliers ``z sqrt(left)`` with the run's ``composition``
    (:func:`protocols.accountant.epsilon_of`: exact Gaussian, or Renyi DP for discrete releases).
    """
    history = []
    for r in releases:
        if not r.get("dp"):
            continue
        if r.get("noise_shares", 2) <= 1:  # DP-SGD (a client's own release), all noise local
            left = 1.0
        elif any(r["tag"] == t or r["tag"].startswith(t) for t in sums):
            left = 1.0 / (1 + max(0, colluding - calibrated))
        else:  # dense sums of n shares (DP-SGD in the secure mean too)
            n = int(r.get("noise_shares", num_clients))
            honest = n - dropouts - colluding
            left = 1.0 if honest <= 0 else honest / max(1, n - dropouts - calibrated)
        history.append((r["noise_multiplier"] * math.sqrt(min(1.0, left)), 1.0, int(r["releases"])))
    eps = epsilon_of(history, delta, composition) if history else 0.0
    return {
        "colluding_clients": colluding,
        "calibrated_colluders": calibrated,
        "dropouts": dropouts,
        "total_epsilon": eps,
        "note": f"distributed noise over-provisioned for {dropouts} dropout(s) and {calibrated} colluding "
        f"client(s): against the server plus {colluding} colluding client(s) (who subtract their "
        f"noise shares) the guarantee is epsilon {eps:.3g} (delta {delta:g})"
        + (", the run's total" if colluding <= calibrated else ", weaker than the run's total"),
    }
