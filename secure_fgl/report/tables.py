"""Tables of the report, computed only from run files (``result.json``).

* :func:`leakage_matrix` -- attacks x settings (mode, DP epsilon) with a chance column and the
  test accuracy in the last row.  A cell is ``mean ± std`` over
  seeds; an attack that could read nothing is ``n/a`` -- ``n/a (chance)`` when the run's
  transcript audit passed, the only case in which a secure-mode result is called "at chance".
* :func:`utility_table` -- accuracy, time, bytes up/down and epsilon spent per exchange.
* :func:`settings_of_runs` -- the settings the runs actually hold: common to all, or per cell.
* :func:`audit_table`, :func:`error_table`, :func:`attack_table`, :func:`code_table`.

Every table renders as Markdown, HTML and LaTeX (booktabs).  Cells are ``mean ± sample std``
(ddof = 1) over seeds, the statistic the figures' error bars show.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from protocols.registry import modes

from ..results import AT_CHANCE_MARGIN
from ..run_identity import code_mismatch, identity

MODE_ORDER = modes()
#: secondary metrics shown under an attack's primary row, with their chance level
SECONDARY: dict[str, list[tuple[str, float | str | None]]] = {
    "fedgcn_readout": [("precision", None), ("bit_auc", 0.5), ("nip", None)],
    "fedgcn_ls": [("identifiable_fraction", None), ("bit_auc", 0.5)],
    "fedgcn_client_subtraction": [("precision", None), ("bit_auc", 0.5)],
    "gradient_inversion": [("support_auc", 0.5), ("label_acc", "label_chance")],
    "gradient_inversion_aggregate": [("support_auc", 0.5), ("label_acc", "label_chance")],
    "gradient_inversion_isolated": [("support_auc", 0.5), ("label_acc", "label_chance")],
    "fedspray_label_dist": [("exact_clients", 0.0)],
    "fedomd_label_dist": [("client_size_exact", 0.0)],
    "coalition": [("implied_isolated_fraction", 0.0)],
    "membership": [("advantage", 0.0), ("tpr_at_1fpr", 0.01)],
    "link_posterior": [("auc_random", 0.5), ("feature_baseline_auc_2hop", None)],
    "link_influence": [("auc_random", 0.5)],
    "gin_gradient_inversion": [("feature_acc", "feature_chance"), ("label_tv", "label_tv_uniform")],
}


@dataclass
class Table:
    """A report table: title, header, rows of formatted cells and a note (rendered as markdown, HTML or LaTeX)."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""

    def to_markdown(self) -> str:
        """The table as markdown (cells with ``|`` escaped)."""
        if not self.rows:
            return f"**{self.title}**: no data.\n"
        esc = [[c.replace("|", "\\|") for c in r] for r in [self.header] + self.rows]
        lines = [
            f"**{self.title}**",
            "",
            "| " + " | ".join(esc[0]) + " |",
            "|" + "|".join("---" for _ in self.header) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """The table as escaped HTML."""
        if not self.rows:
            return f"<p><b>{html.escape(self.title)}</b>: no data.</p>"
        out = [f"<table><caption>{html.escape(self.title)}</caption><thead><tr>"]
        out += [f"<th>{html.escape(h)}</th>" for h in self.header]
        out.append("</tr></thead><tbody>")
        for r in self.rows:
            out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        out.append("</tbody></table>")
        if self.note:
            out.append(f"<p class='note'>{html.escape(self.note)}</p>")
        return "".join(out)

    def to_latex(self) -> str:
        r"""A ``table`` with a booktabs ``tabular`` (``\usepackage{booktabs}``), the note as a footnote line."""
        if not self.rows:
            return ""
        cols = "l" + "r" * (len(self.header) - 1)
        lines = [
            "\\begin{table}[t]",
            "\\centering",
            "\\small",
            f"\\caption{{{latex_escape(self.title)}}}",
            f"\\begin{{tabular}}{{{cols}}}",
            "\\toprule",
            " & ".join(latex_escape(h) for h in self.header) + " \\\\",
            "\\midrule",
        ]
        lines += [" & ".join(latex_escape(c) for c in r) + " \\\\" for r in self.rows]
        lines += ["\\bottomrule", "\\end{tabular}"]
        if self.note:
            lines.append(f"\\par\\footnotesize {latex_escape(self.note)}")
        lines.append("\\end{table}")
        return "\n".join(lines) + "\n"


#: characters LaTeX treats specially, and the unicode the tables print
_LATEX = {
    "\\": "\\textbackslash{}",
    "&": "\\&",
    "%": "\\%",
    "$": "\\$",
    "#": "\\#",
    "_": "\\_",
    "{": "\\{",
    "}": "\\}",
    "~": "\\textasciitilde{}",
    "^": "\\textasciicircum{}",
    "±": "$\\pm$",
    "ε": "$\\varepsilon$",
    "∞": "$\\infty$",
    "—": "--",
    "↓": "$\\downarrow$",
    "└": "",
    "≤": "$\\le$",
    "≥": "$\\ge$",
    "δ": "$\\delta$",
    "→": "$\\to$",
}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


# ----------------------------------------------------------------------------- helpers
def run_eps(r: dict) -> float | None:
    """The run's DP epsilon, ``None`` without DP (or an infinite budget)."""
    e = r["config"].get("dp_epsilon")
    return None if e is None or (isinstance(e, float) and math.isinf(e)) else float(e)


def setting_label(mode: str, eps: float | None) -> str:
    """``mode`` or ``mode ε=eps``: the column label of a setting."""
    return mode if eps is None else f"{mode} ε={eps:g}"


def settings_of(results: Iterable[dict]) -> list[tuple[str, float | None]]:
    """The distinct ``(mode, epsilon)`` settings of ``results``.

    Modes in report order; within a mode no DP first, then epsilon descending.
    """
    keys = {(r["config"]["mode"], run_eps(r)) for r in results}

    def order(k):
        mode, eps = k
        mi = MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)
        return (mi, mode, 0 if eps is None else 1, -(eps or 0))

    return sorted(keys, key=order)


def fmt_num(v: float | None, digits: int = 3) -> str:
    """``v`` to ``digits`` decimals; a dash when missing or not finite."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:.{digits}f}"


def fmt_stats(values: list[float], digits: int = 3) -> str:
    """Mean ± sample standard deviation of the finite ``values`` (the value alone when there is one)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return "—"
    if len(vals) == 1:
        return fmt_num(vals[0], digits)
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


def group(results: Iterable[dict], *keys: str) -> dict[tuple, list[dict]]:
    """``results`` grouped by the config values of ``keys`` (``dp_epsilon`` as :func:`run_eps`)."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        k = tuple(r["config"][key] if key != "dp_epsilon" else run_eps(r) for key in keys)
        out[k].append(r)
    return out


def attack_entries(r: dict) -> dict[str, dict]:
    """The run's attack entries by name."""
    return {a["name"]: a for a in (r.get("attacks") or [])}


def audit_of(r: dict) -> dict | None:
    """The run's transcript-audit entry, if any."""
    return attack_entries(r).get("transcript_audit")


def final_acc(r: dict) -> float | None:
    """The run's final test accuracy."""
    return (r.get("final") or {}).get("test_acc")


def _interval(entry: dict) -> str:
    """`` [lo, hi]``: the attack's own confidence interval (``ci``), when it reports one."""
    ci = entry.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
        return f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return ""


def _below_chance(entries: list[dict]) -> str:
    """`` (below chance?)`` when an attack that leaks by scoring high has an interval wholly under its chance level.

    An attack cannot do worse than guessing, so the measurement is suspect.
    """
    for e in entries:
        if e.get("below_chance"):  # the attack's own verdict (attacks.significance)
            return " (below chance?)"
        ci, chance = e.get("ci"), e.get("chance")
        if "below_chance" not in e and (
            e.get("applicable")
            and e.get("higher_is_leakier", True)
            and isinstance(chance, (int, float))
            and isinstance(ci, (list, tuple))
            and len(ci) == 2
            and isinstance(ci[1], (int, float))
            and ci[1] < chance
        ):
            return " (below chance?)"
    return ""


def _cell(entries: list[dict], key: str) -> str:
    """One matrix cell from the entries of one attack across seeds."""
    if not entries:
        return "—"
    vals = [e.get(key) for e in entries if e.get("applicable")]
    vals = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if vals:
        return (
            fmt_stats([float(v) for v in vals])
            + (_interval(entries[0]) if key == "value" and len(vals) == 1 else "")
            + (_below_chance(entries) if key == "value" else "")
        )
    if any(e.get("applicable") for e in entries):
        return "—"
    if all(e.get("at_chance") for e in entries):
        return "n/a (chance)"
    return "n/a"


def accuracy_chance(runs: list[dict]) -> float | None:
    """Chance accuracy 1 / number of classes (``result['num_classes']``), if the runs record it."""
    k = next((r.get("num_classes") for r in runs if r.get("num_classes")), None)
    return 1.0 / k if k else None


def at_chance_label(accs: list[float | None], chance: float | None) -> str:
    """``AT CHANCE`` when the mean accuracy is within max(std, 0.05) of chance, else ``no``.

    A privacy result read off a model that learned nothing means nothing.
    """
    vals = [float(a) for a in accs if a is not None]
    if not vals or chance is None:
        return "—"
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
    return "AT CHANCE" if mean - chance <= max(std, AT_CHANCE_MARGIN) else "no"


# ----------------------------------------------------------------------------- tables
def leakage_matrix(results: list[dict], algorithm: str, dataset: str) -> Table:
    """The leakage matrix of one algorithm and dataset.

    One row per attack metric, one column per setting (mode, epsilon), then the chance level; each cell the mean
    ± sample std over seeds, or with one seed the value and its 95 % interval, marked when the interval lies wholly
    on the non-leaky side of chance; the last rows say whether the model learned anything (the table's note).
    """
    runs = [r for r in results if r["config"]["algorithm"] == algorithm and r["config"]["dataset"] == dataset]
    settings = settings_of(runs)
    by_setting = {s: [r for r in runs if (r["config"]["mode"], run_eps(r)) == s] for s in settings}
    header = ["attack (observer): metric"] + [setting_label(*s) for s in settings] + ["chance"]
    names: list[str] = []
    for r in runs:
        for a in r.get("attacks") or []:
            if a["name"] != "transcript_audit" and a["name"] not in names:
                names.append(a["name"])
    rows = []
    for name in names:
        per = {s: [attack_entries(r)[name] for r in rs if name in attack_entries(r)] for s, rs in by_setting.items()}
        any_e = next((e for es in per.values() for e in es if e.get("applicable")), None)
        first = any_e or next((e for es in per.values() for e in es), {})
        metric = first.get("metric") or "—"
        arrow = "" if first.get("higher_is_leakier", True) else " (↓ leakier)"
        rows.append(
            [f"{name} ({first.get('observer', '?')}): {metric}{arrow}"]
            + [_cell(per[s], "value") for s in settings]
            + [fmt_num(first.get("chance"))]
        )
        for sec, chance in SECONDARY.get(name, []):
            if not any(sec in e for es in per.values() for e in es):
                continue
            ch = any_e.get(chance) if isinstance(chance, str) and any_e else chance
            rows.append(
                [f"  └ {sec}"]
                + [_cell(per[s], sec) for s in settings]
                + [fmt_num(ch) if not isinstance(ch, str) else "—"]
            )
    audit_row = ["transcript audit (server)"]
    for s in settings:
        aud = [audit_of(r) for r in by_setting[s]]
        aud = [a for a in aud if a]
        if not aud:
            audit_row.append("—")
        elif s[0] == "plain":
            audit_row.append("plain: exposed")
        else:
            audit_row.append("PASS" if all(a.get("value") == 1.0 for a in aud) else "FAIL")
    rows.append(audit_row + ["—"])
    chance = accuracy_chance(runs)
    rows.append(
        ["model at chance?"]
        + [at_chance_label([final_acc(r) for r in by_setting[s]], chance) for s in settings]
        + [fmt_num(chance)]
    )
    rows.append(["test accuracy"] + [fmt_stats([final_acc(r) for r in by_setting[s]]) for s in settings] + ["—"])
    seeds = sorted({r["config"]["seed"] for r in runs})
    return Table(
        f"Leakage matrix — {algorithm} on {dataset} ({len(seeds)} seed(s))",
        header,
        rows,
        note="Cells: mean ± sample std over seeds; with one seed, the value and the attack's own 95% "
        "interval [lo, hi] when it reports one ('below chance?': the interval lies wholly on the "
        "non-leaky side of chance, a suspect measurement). n/a: the observer could read nothing the attack needs; "
        "n/a (chance): ... and the transcript audit passed, so the result is at chance. "
        "(↓ leakier): lower values leak more (distance to the truth). model at chance?: AT CHANCE when "
        "the mean test accuracy is within max(std, 0.05) of 1/classes -- read no privacy result off it.",
    )


#: the grid's axes: a report varies them on purpose, every other setting should be equal
GRID_AXES = ("algorithm", "dataset", "mode", "dp_epsilon", "seed")


def _show(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_show(v)}" for k, v in sorted(value.items())) + "}" if value else "{}"
    return "—" if value is None else str(value)


def settings_of_runs(results: list[dict]) -> tuple[dict[str, str], Table]:
    """The settings the runs hold (their resolved configs).

    ``(common, per_cell)`` -- the settings equal in every run (options per algorithm), and a table of those that differ,
    one row per (algorithm, dataset, mode, epsilon) cell (several values in a cell: ``a | b``).
    """
    ids = [identity(r.get("config") or {}) for r in results]
    keys = sorted({k for i in ids for k in i if k not in GRID_AXES and k != "options"})
    common, varying = {}, []
    for k in keys:
        values = {_show(i.get(k)) for i in ids}
        if len(values) == 1:
            common[k] = values.pop()
        else:
            varying.append(k)
    for algo in sorted({r["config"]["algorithm"] for r in results}):
        opts = {_show(i.get("options")) for i, r in zip(ids, results) if r["config"]["algorithm"] == algo}
        if len(opts) == 1:
            common[f"options of {algo}"] = opts.pop()
        elif "options" not in varying:
            varying.append("options")
    rows = []
    if varying:
        cells = group(results, "algorithm", "dataset", "mode", "dp_epsilon")
        for (a, d, m, e), rs in sorted(cells.items(), key=lambda kv: str(kv[0])):
            cell_ids = [identity(r["config"]) for r in rs]
            rows.append(
                [a, d, m, "∞" if e is None else f"{e:g}"]
                + [" | ".join(sorted({_show(i.get(k)) for i in cell_ids})) for k in varying]
            )
    return common, Table(
        "Settings that differ between cells",
        ["algorithm", "dataset", "mode", "ε", *varying],
        rows,
        note="Compare cells only where their settings agree.",
    )


def code_table(results: list[dict]) -> Table:
    """Runs made by other code than this checkout's (version or commit differ): kept, marked."""
    rows = [[r.get("_run_id", "?"), m] for r in results if (m := code_mismatch(r))]
    return Table("Runs made by other code than this version (kept; rerun them to refresh)", ["run", "code"], rows)


def _eps_spent(r: dict) -> tuple[str, str]:
    p = r.get("privacy")
    if not p:
        return "—", "—"
    total = p.get("total_epsilon")
    per = p.get("per_tag") or {}
    parts = [f"{tag}: {fmt_num(v.get('epsilon'), 2)}" for tag, v in sorted(per.items())]
    return fmt_num(total, 2), "; ".join(parts) if parts else "—"


def utility_table(results: list[dict]) -> Table:
    """Accuracy, time, bytes and DP budget spent per (algorithm, dataset, mode, epsilon), over seeds."""
    header = [
        "algorithm",
        "dataset",
        "mode",
        "ε (budget)",
        "seeds",
        "test acc",
        "time total (s)",
        "setup (s)",
        "train (s)",
        "bytes up (MB)",
        "bytes down (MB)",
        "ε spent",
        "ε per exchange",
    ]
    rows = []
    groups = group(results, "algorithm", "dataset", "mode", "dp_epsilon")
    stale = any(code_mismatch(r) for r in results)  # a column only when some run was made by other code

    def order(k):
        a, d, m, e = k
        return (a, d, MODE_ORDER.index(m) if m in MODE_ORDER else 9, 0 if e is None else 1, -(e or 0))

    for key in sorted(groups, key=order):
        rs = groups[key]
        a, d, m, e = key
        t = [r.get("time") or {} for r in rs]
        c = [r.get("comm") or {} for r in rs]
        spent = _eps_spent(rs[0])
        rows.append(
            [
                a,
                d,
                m,
                "∞" if e is None else f"{e:g}",
                str(len(rs)),
                fmt_stats([final_acc(r) for r in rs]),
                fmt_stats([x.get("total") for x in t], 2),
                fmt_stats([x.get("setup") for x in t], 2),
                fmt_stats([x.get("train") for x in t], 2),
                fmt_stats([(x.get("bytes_up") or 0) / 1e6 for x in c], 3),
                fmt_stats([(x.get("bytes_down") or 0) / 1e6 for x in c], 3),
                spent[0],
                spent[1],
            ]
        )
        if stale:
            rows[-1].append("; ".join(sorted({code_mismatch(r) or "this version" for r in rs})))
    return Table(
        "Utility and cost",
        header + ["code"] * stale,
        rows,
        note="ε spent: the accountant's total over every release of the run (first seed shown); "
        "bytes as recorded in the transcript.",
    )


def audit_table(results: list[dict]) -> Table:
    """The transcript audit of each run: verdict, number of failures and the first warnings."""
    header = ["run", "mode", "audit", "failures", "warnings (first)"]
    rows = []
    for r in results:
        a = audit_of(r)
        if not a:
            continue
        status = "exposed (plain)" if r["config"]["mode"] == "plain" else ("PASS" if a.get("value") == 1.0 else "FAIL")
        fails = (
            "; ".join(a.get("failures") or [])[:300]
            if r["config"]["mode"] != "plain"
            else f"{a.get('num_failures', 0)} plaintext exchange(s)"
        )
        warns = (a.get("warnings") or ["—"])[0][:200]
        rows.append([r.get("_run_id", "?"), r["config"]["mode"], status, fails or "—", warns])
    return Table("Transcript audit per run", header, rows)


def audit_exchange_table(results: list[dict]) -> Table:
    """Per mode and exchange: kinds uploaded, sizes, data dependence."""
    header = [
        "mode",
        "exchange",
        "kinds up",
        "bytes up (all rounds)",
        "client bytes min..max",
        "size depends on data",
        "layout",
        "side fields",
    ]
    rows, seen = [], set()
    for r in results:
        a = audit_of(r)
        mode = r["config"]["mode"]
        for ex in (a or {}).get("exchanges") or []:
            key = (mode, ex["tag"])
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                [
                    mode,
                    ex["tag"],
                    ",".join(ex.get("kinds_up") or []),
                    str(ex.get("bytes_up")),
                    f"{ex.get('min_client_bytes')}..{ex.get('max_client_bytes')}",
                    "yes"
                    if ex.get("size_depends_on_data")
                    else (f"jitter {ex['size_jitter']:.2%}" if ex.get("size_jitter") else "no"),
                    ex.get("layout", "—"),
                    str(ex.get("side_fields", 0)),
                ]
            )
    rows.sort(key=lambda row: (MODE_ORDER.index(row[0]) if row[0] in MODE_ORDER else 9, row[1]))
    return Table("What the server receives, per exchange (first run of each mode)", header, rows)


def attack_table(results: list[dict]) -> Table:
    """Each attack the runs ran: observer, exchange, background knowledge and metric."""
    header = ["attack", "observer", "exchange", "background knowledge", "metric"]
    rows, seen = [], set()
    for r in results:
        for a in r.get("attacks") or []:
            if a["name"] in seen or a["name"] == "transcript_audit":
                continue
            seen.add(a["name"])
            rows.append(
                [
                    a["name"],
                    a.get("observer", "?"),
                    a.get("exchange", "?"),
                    ", ".join(a.get("knowledge") or []) or "—",
                    a.get("metric") or "—",
                ]
            )
    return Table("Attacks", header, rows)


def error_table(errors: list[dict]) -> Table:
    """The runs that failed, with their errors."""
    rows = [[e.get("_run_id", "?"), e.get("error", "?")[:300]] for e in errors]
    return Table("Failed runs", ["run", "error"], rows)


def skipped_attacks(results: list[dict]) -> Table:
    """Why attacks were not applicable, per setting (one row per distinct reason)."""
    rows, seen = [], set()
    for r in results:
        for a in r.get("attacks") or []:
            if a.get("applicable", True):
                continue
            key = (a["name"], r["config"]["mode"], a.get("reason", ""))
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                [
                    a["name"],
                    r["config"]["algorithm"],
                    r["config"]["mode"],
                    a.get("reason", "")[:200],
                    "yes" if a.get("at_chance") else "no",
                ]
            )
    return Table(
        "Attacks not applicable, and why", ["attack", "algorithm", "mode", "reason", "at chance (audit passed)"], rows
    )
