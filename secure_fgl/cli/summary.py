"""The end-of-run summary the CLI prints: numbers formatted, nothing shown as ``None``."""

from __future__ import annotations


def _num(value, fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def privacy_line(result: dict) -> str:
    """One line on the run's DP: the epsilon spent of the budget, delta, accountant and noise placement."""
    cfg, privacy = result["config"], result.get("privacy")
    if cfg.get("dp_epsilon") is None or not privacy:
        return "privacy: no DP"
    spent = privacy.get("total_epsilon")
    accountant = privacy.get("accountant")
    how = f"delta {cfg['dp_delta']:g}" + (f", {str(accountant).upper()}" if accountant else "")
    return (
        f"privacy: epsilon {_num(spent, '.2f')} spent of {cfg['dp_epsilon']:g} ({how}, "
        f"{privacy.get('placement') or cfg['dp_placement']} noise)"
    )


def attack_line(entry: dict) -> str:
    """One line per attack entry: its metric, value and chance level, or why it failed or did not apply."""
    name = entry.get("name")
    if entry.get("error") and entry.get("value") is None:
        return f"attack {name}: failed ({entry['error'].strip().splitlines()[-1][:120]})"
    if not entry.get("applicable", True):
        return f"attack {name}: not applicable ({entry.get('reason') or 'no target in this run'})"
    chance = entry.get("chance")
    observer = entry.get("observer")
    return (
        f"attack {name}" + (f" by {observer}" if observer is not None else "") + f": {entry.get('metric')} "
        f"{_num(entry.get('value'), '.3f')}" + (f" (chance {_num(chance, '.3f')})" if chance is not None else "")
    )


def format_summary(result: dict) -> str:
    """The text summary printed after a run: accuracy, communication, time, privacy and attacks."""
    cfg, final, comm, t = result["config"], result["final"], result["comm"], result["time"]
    lines = [
        f"algorithm {cfg['algorithm']}  dataset {cfg['dataset']}  clients {result['num_clients']}  "
        f"mode {cfg['mode']}  device {result['device']}",
        f"test accuracy   {_num(final['test_acc'])}  (val {_num(final['val_acc'])}, best round "
        f"{final['best_round']} of {final['rounds_run']})",
    ]
    if final.get("at_chance"):
        lines.append(
            f"AT CHANCE: test accuracy {final['test_acc']:.4f} is within 0.05 of 1/{result.get('num_classes')} "
            "classes: the model learned nothing (read no privacy result off it)"
        )
    for key in sorted(k for k in final if k.endswith("_acc") and k not in ("test_acc", "val_acc", "train_acc")):
        if isinstance(final[key], float):
            lines.append(f"{key:<15} {final[key]:.4f}")
    lines.append(f"{'exchange':<34}{'up (MB)':>12}{'down (MB)':>12}{'plain-equiv up (MB)':>22}")
    for tag, v in comm["per_tag"].items():
        plain = v.get("plaintext_bytes_up")
        plain_txt = f"{plain / 1e6:.3f}" if plain is not None else "-"
        lines.append(f"{tag:<34}{v['bytes_up'] / 1e6:>12.3f}{v['bytes_down'] / 1e6:>12.3f}{plain_txt:>22}")
    lines.append(
        f"{'total':<34}{comm['bytes_up'] / 1e6:>12.3f}{comm['bytes_down'] / 1e6:>12.3f}"
        f"{(comm.get('plaintext_bytes_up') or 0) / 1e6:>22.3f}"
    )
    lines.append("time (s): " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()))
    lines.append(privacy_line(result))
    lines.extend(attack_line(a) for a in result.get("attacks") or [])
    return "\n".join(lines)
