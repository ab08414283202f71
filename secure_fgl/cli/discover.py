"""Discovery and analysis commands: ``algorithms [NAME]``, ``attacks``, ``modes``, ``compare``, ``plot``."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from protocols.registry import backend, modes

from ..validation import ConfigError, describe, flag_name

MODES = {name: backend(name).summary for name in modes()}


def _wrap(text: str, indent: str = "  ") -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ")


def algorithms_command(name: str | None) -> int:
    """``secure-fgl algorithms [NAME]``: list the algorithms, or one algorithm's paper, exchanges, options and presets.

    Returns:
        The exit status (0).
    """
    from ..algorithms import SPECS, get_spec
    from ..presets import preset_description, presets_of

    if name is None:
        for key, spec in SPECS.items():
            print(f"{key:<14}{spec.summary}")
        print("\nsecure-fgl algorithms NAME: its paper, exchanges, options and presets")
        return 0
    spec = get_spec(name)
    key = spec.name
    print(f"{key}: {spec.summary}")
    print(_wrap(f"paper: {spec.paper}"))
    print(_wrap(f"exchanges: {spec.exchanges}"))
    print(_wrap(f"modes: {', '.join(spec.modes)}"))
    fields = dataclasses.fields(spec.options)
    print("options:" if fields else "options: none")
    for f in fields:
        print(f"  {flag_name(f.name):<20}{describe(f)}")
    presets = presets_of(key)
    print("presets:" if presets else "presets: none")
    for p in presets:
        print(f"  {p:<20}{preset_description(p)}   (secure-fgl run --preset {p})")
    return 0


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line (whole sentences, never cut mid-sentence)."""
    lines = []
    for line in (doc or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines) or "-"


def datasets_command(data_root: str | None) -> int:
    """Every ``--dataset`` name.

    The registry's datasets, the built-in graph-classification generator and GCFL's groups of TU datasets (present when
    all their members are).
    """
    from ..data import GCFL_GROUPS, dataset_status
    from ..data.datasets import SYNTHETIC_GRAPHS

    rows = dataset_status(data_root)
    present = {r["name"].lower(): r["present"] for r in rows}
    rows.append({"name": SYNTHETIC_GRAPHS, "task": "graph", "present": True, "path": None})
    for group, members in GCFL_GROUPS.items():
        missing = [m for m in members if not present.get(m.lower())]
        rows.append(
            {
                "name": group,
                "task": "graph",
                "present": not missing,
                "path": f"group of {len(members)} TU datasets" + (f"; missing {', '.join(missing)}" if missing else ""),
            }
        )
    width = max(len(r["name"]) for r in rows) + 2
    print(f"{'name':<{width}}{'task':<8}{'present':<9}path")
    for r in rows:
        print(f"{r['name']:<{width}}{r['task']:<8}{'yes' if r['present'] else 'no':<9}{r['path'] or '(built in)'}")
    return 0


def attacks_command() -> int:
    """``secure-fgl attacks``: every attack's name, targets and summary, read from source (no torch import)."""
    from attacks.catalog import attack_catalog  # read from source: no torch import

    catalog = attack_catalog()
    width = max(len(a.name) for a in catalog) + 2
    for attack in catalog:
        targets = ", ".join(attack.algorithms) if attack.algorithms else "any node-level algorithm"
        text = textwrap.fill(
            first_paragraph(attack.doc), width=110, initial_indent=" " * width, subsequent_indent=" " * width
        )
        print(f"{attack.name:<{width}}{text[width:]}")
        print(f"{'':<{width}}exchange {attack.exchange}; targets {targets}")
    print("\nsecure-fgl run ... --attacks all | NAME[,NAME]")
    return 0


def modes_command() -> int:
    """``secure-fgl modes``: the secure-aggregation modes, one line each."""
    width = max(map(len, MODES)) + 2
    for name, text in MODES.items():
        print(f"{name:<{width}}{text}")
    print("\nAll modes take --dp-epsilon for differential privacy on top (see docs/dp.md).")
    return 0


COMPARE_COLUMNS = (
    ("config.algorithm", "algorithm", "{}"),
    ("config.dataset", "dataset", "{}"),
    ("config.mode", "mode", "{}"),
    ("config.clients", "clients", "{}"),
    ("config.seed", "seed", "{}"),
    ("config.dp_epsilon", "eps", "{:g}"),
    ("final.test_acc", "test_acc", "{:.4f}"),
    ("final.val_acc", "val_acc", "{:.4f}"),
    ("final.best_round", "best", "{}"),
    ("comm.bytes_up", "up_MB", "{:.2f}"),
    ("time.total", "total_s", "{:.1f}"),
)


def compare_command(paths: list[str], include_unfinished: bool = False) -> int:
    """``secure-fgl compare``: one table row per finished run under ``paths``.

    Args:
        paths: Run folders, or folders holding them.
        include_unfinished: Also list runs that did not finish.

    Returns:
        The exit status (0).

    Raises:
        ConfigError: No ``result.json`` under ``paths``.
    """
    from ..results import find_results, flatten, read_finished

    if not find_results(*paths):
        raise ConfigError(f"no result.json under {', '.join(paths)}; give run folders (secure-fgl run --out DIR)")
    kept, left = read_finished(*paths, include_unfinished=include_unfinished)
    rows = []
    for path, result in kept:
        flat = flatten(result)
        row = [str(path.parent)]
        for key, _, fmt in COMPARE_COLUMNS:
            value = flat.get(key)
            if key == "comm.bytes_up" and value is not None:
                value = value / 1e6
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    header = ["run"] + [label for _, label, _ in COMPARE_COLUMNS]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if left:
        print(
            f"left out {len(left)} unfinished run(s): {', '.join(str(p.parent) for p in left[:5])}"
            f"{', ...' if len(left) > 5 else ''} (--include-unfinished to show them)"
        )
    return 0


def plot_command(run: str, out: str | None) -> int:
    """``secure-fgl plot``: the training curves of one run as an image.

    Args:
        run: A run folder or its ``result.json``.
        out: The image file (default: ``curves.png`` in the run folder).

    Returns:
        The exit status (0).

    Raises:
        ConfigError: No ``result.json`` at ``run``.
    """
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(run) / "result.json" if Path(run).is_dir() else Path(run)
    if not path.is_file():
        raise ConfigError(f"no result.json at {run}; give a run folder (secure-fgl run --out DIR)")
    result = json.loads(path.read_text())
    rounds = result.get("rounds") or []
    if not rounds:
        raise ConfigError(f"{path} has no rounds to plot")
    xs = [r["round"] for r in rounds]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(xs, [r.get("train_loss") for r in rounds])
    ax_loss.set(xlabel="round", ylabel="train loss")
    for key in ("train_acc", "val_acc", "test_acc"):
        if key in rounds[0]:
            ax_acc.plot(xs, [r[key] for r in rounds], label=key.replace("_acc", ""))
    best = result["final"].get("best_round")
    if best is not None and best >= 0:
        ax_acc.axvline(best, color="grey", linestyle=":", label="best validation")
    ax_acc.set(xlabel="round", ylabel="accuracy")
    ax_acc.legend()
    cfg = result["config"]
    fig.suptitle(f"{cfg['algorithm']} / {cfg['dataset']} / {cfg['mode']}, {result['num_clients']} clients")
    fig.tight_layout()
    target = Path(out) if out else path.parent / "curves.png"
    fig.savefig(target, dpi=120)
    plt.close(fig)
    print(f"curves: {target}")
    return 0
