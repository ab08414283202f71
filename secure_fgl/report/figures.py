"""PNG figures of the report (matplotlib, Agg backend), computed only from run files.

* :func:`epsilon_curves` -- per attack: test accuracy (left axis, solid) and the attack's primary
  metric (right axis, dashed) against DP epsilon on a log axis, "∞" (no DP) at the right, one
  colour per mode, the chance level dotted (Jayaraman & Evans style).
* :func:`frontier` -- privacy-utility frontier: mean normalised leakage over the run's attacks
  vs accuracy, one point per (mode, epsilon), the Pareto front drawn.
* :func:`exposure_by_degree` -- FedGCN per-node exposure against the node's number of
  cross-client neighbours (explains why single-contributor rows exist).
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from protocols.registry import colours  # noqa: E402

from .tables import MODE_ORDER, attack_entries, final_acc, run_eps  # noqa: E402

COLORS = colours()



def _save(fig, path: str | Path) -> Path:
    """Lay out, write as PNG and close ``fig``; returns the path."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

def _eps_positions(eps_values: list[float]) -> tuple[dict, float]:
    finite = sorted(e for e in eps_values if e is not None)
    inf_pos = (max(finite) * 4) if finite else 1.0
    return {e: (inf_pos if e is None else e) for e in eps_values}, inf_pos


def _mean_std(vals):
    vals = [v for v in vals if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return None, None
    return float(np.mean(vals)), float(np.std(vals))


def normalised_leakage(entry: dict) -> float | None:
    """(m - chance) / (max - chance) in [0, 1] (1 = full leakage); 0 for a not-applicable attack
    whose audit passed; None when undefined."""
    if not entry.get("applicable"):
        return 0.0 if entry.get("at_chance") else None
    v, c = entry.get("value"), entry.get("chance")
    if v is None or c is None:
        return None
    if entry.get("higher_is_leakier", True):
        top = 1.0
        return float(np.clip((v - c) / (top - c), 0, 1)) if top > c else None
    return float(np.clip((c - v) / c, 0, 1)) if c > 0 else None


def epsilon_curves(results: list[dict], algorithm: str, dataset: str, path: str | Path) -> Path | None:
    runs = [r for r in results if r["config"]["algorithm"] == algorithm and r["config"]["dataset"] == dataset]
    if not runs:
        return None
    names, with_metric = [], set()
    for r in runs:                      # run order of the suite, whatever mode was read first
        for a in r.get("attacks") or []:
            if a["name"] != "transcript_audit" and a["name"] not in names:
                names.append(a["name"])
            if a.get("metric"):
                with_metric.add(a["name"])
    names = [n for n in names if n in with_metric]
    if not names:
        names = [None]
    eps_all = sorted({run_eps(r) for r in runs}, key=lambda e: (e is None, e or 0))
    pos, inf_pos = _eps_positions(eps_all)
    modes = sorted({r["config"]["mode"] for r in runs}, key=lambda m: MODE_ORDER.index(m) if m in MODE_ORDER else 9)
    ncol = min(3, len(names))
    nrow = math.ceil(len(names) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.4 * nrow), squeeze=False)
    for idx, name in enumerate(names):
        ax = axes[idx // ncol][idx % ncol]
        ax2 = ax.twinx()
        chance = None
        for mode in modes:
            xs, acc, acc_s, lk, lk_s = [], [], [], [], []
            for e in eps_all:
                rs = [r for r in runs if r["config"]["mode"] == mode and run_eps(r) == e]
                if not rs:
                    continue
                m, s = _mean_std([final_acc(r) for r in rs])
                ents = [attack_entries(r).get(name) for r in rs] if name else []
                ents = [x for x in ents if x]
                vals = [x.get("value") for x in ents if x.get("applicable")]
                if ents and not vals and all(x.get("at_chance") for x in ents):
                    vals = [x.get("chance") for x in ents]       # at chance (audit passed)
                lm, ls = _mean_std(vals)
                chance = chance if chance is not None else next((x.get("chance") for x in ents
                                                                 if x.get("chance") is not None), None)
                xs.append(pos[e]); acc.append(m); acc_s.append(s); lk.append(lm); lk_s.append(ls)
            col = COLORS.get(mode, None)
            if any(a is not None for a in acc):
                ax.plot([x for x, a in zip(xs, acc) if a is not None], [a for a in acc if a is not None], "-o",
                        color=col, label=f"{mode} accuracy", ms=4)
            pts = [(x, v, s) for x, v, s in zip(xs, lk, lk_s) if v is not None]
            if pts:
                px, pv, ps = map(np.array, zip(*pts))
                ax2.plot(px, pv, "--s", color=col, label=f"{mode} attack", ms=4, alpha=0.8)
                ax2.fill_between(px, pv - ps, pv + ps, color=col, alpha=0.12)
        if chance is not None:
            ax2.axhline(chance, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ticks = [pos[e] for e in eps_all]
        ax.set_xticks(ticks)
        ax.set_xticklabels(["∞" if e is None else f"{e:g}" for e in eps_all])
        ax.minorticks_off()
        ax.set_xlabel("DP ε (∞ = no DP)")
        ax.set_ylabel("test accuracy")
        metric = next((attack_entries(r)[name].get("metric") for r in runs
                       if name in attack_entries(r) and attack_entries(r)[name].get("metric")), "")
        ax2.set_ylabel(f"{metric} (dashed)")
        ax.set_title(f"{name or 'accuracy'}", fontsize=9)
        if idx == 0:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=6, loc="best")
    for idx in range(len(names), nrow * ncol):
        axes[idx // ncol][idx % ncol].axis("off")
    fig.suptitle(f"{algorithm} on {dataset}: accuracy and leakage vs ε", fontsize=10)
    return _save(fig, path)


def frontier(results: list[dict], algorithm: str, dataset: str, path: str | Path) -> Path | None:
    runs = [r for r in results if r["config"]["algorithm"] == algorithm and r["config"]["dataset"] == dataset]
    pts = []
    keys = sorted({(r["config"]["mode"], run_eps(r)) for r in runs}, key=lambda k: (k[0], k[1] is None, k[1] or 0))
    for mode, e in keys:
        rs = [r for r in runs if r["config"]["mode"] == mode and run_eps(r) == e]
        leaks = []
        for r in rs:
            vals = [normalised_leakage(a) for n, a in attack_entries(r).items() if n != "transcript_audit"]
            vals = [v for v in vals if v is not None]
            if vals:
                leaks.append(float(np.mean(vals)))
        acc, _ = _mean_std([final_acc(r) for r in rs])
        lk, _ = _mean_std(leaks)
        if acc is not None and lk is not None:
            pts.append((lk, acc, mode, e))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    for lk, acc, mode, e in pts:
        ax.scatter(lk, acc, color=COLORS.get(mode, "k"), s=30)
        ax.annotate(f"{mode} {'∞' if e is None else f'ε={e:g}'}", (lk, acc), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    # Pareto front: no other point has both less leakage and more accuracy
    front = sorted([p for p in pts if not any(q[0] <= p[0] and q[1] >= p[1] and (q[0], q[1]) != (p[0], p[1])
                                                for q in pts)])
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
        ax.legend(fontsize=7)
    ax.set_xlabel("mean normalised leakage (0 = chance, 1 = full)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{algorithm} on {dataset}: privacy-utility frontier", fontsize=10)
    return _save(fig, path)


def exposure_by_degree(results: list[dict], path: str | Path) -> Path | None:
    series = {}
    for r in results:
        for name, a in attack_entries(r).items():
            hist = a.get("by_cross_degree")
            if not hist or not a.get("applicable"):
                continue
            if run_eps(r) is not None:         # the no-DP runs show the structure; DP only blurs it
                continue
            key = (name, r["config"]["dataset"], r["config"]["mode"], run_eps(r))
            acc = series.setdefault(key, {})
            for b, (ex, tot) in hist.items():
                s = acc.setdefault(b, [0, 0])
                s[0] += ex
                s[1] += tot
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for (name, ds, mode, e), hist in sorted(series.items(), key=lambda kv: str(kv[0])):
        buckets = sorted(hist, key=lambda b: int(b.rstrip("+")))
        xs = [int(b.rstrip("+")) for b in buckets]
        ys = [hist[b][0] / hist[b][1] if hist[b][1] else np.nan for b in buckets]
        ax.plot(xs, ys, marker="o", ms=3, label=f"{name} [{ds}, {mode}{'' if e is None else f', ε={e:g}'}]",
                color=COLORS.get(mode), alpha=0.85, ls="-" if "readout" in name else "--" if "client" in name else ":")
        ax.set_xticks(xs)
        ax.set_xticklabels(buckets)
    ax.set_xlabel("cross-client neighbours of the node")
    ax.set_ylabel("share of nodes exposed exactly")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("FedGCN: per-node exposure vs cross-client degree", fontsize=10)
    ax.legend(fontsize=6)
    return _save(fig, path)
