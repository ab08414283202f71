"""The run's privacy section: unit, budget spent as asked, every release named, claims checked."""

from __future__ import annotations

import pytest

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.privacy import dp_config, parse_budget_shares

TINY = {"num_nodes": 120, "num_features": 12}


def tiny_run(**kw):
    cfg = RunConfig(**{"mode": "plain", "clients": 3, "rounds": 2, "dp_epsilon": 4.0, "synthetic": dict(TINY), **kw})
    return run_experiment(cfg, progress=False)["privacy"]


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_privacy_section_spends_the_budget_and_matches_opacus():
    """Privacy section spends the budget and matches opacus.

    Asking epsilon 4 spends 4 (within 1 %), and Opacus' RDP accountant, given the same
    releases, agrees within 1 % (the releases are discrete: they compose in Renyi DP).
    """
    from opacus.accountants import RDPAccountant

    from protocols.accountant import opacus_options

    p = tiny_run(algorithm="fedgcn-gap")
    assert p["unit"] == "edge" and p["delta"] == 1e-5 and p["accountant"] == "exact" and p["claim_holds"]
    assert [r["tag"] for r in p["releases"] if r["dp"]] == ["fedgcn-gap/hop/1", "fedgcn-gap/hop/2"]
    assert 0.99 * 4.0 <= p["total_epsilon"] <= 4.0
    assert p["composition"] == "rdp"
    acc = RDPAccountant()
    acc.history = [(r["noise_multiplier"], 1.0, r["releases"]) for r in p["releases"] if r["dp"]]
    opts = opacus_options(acc.history, 1e-5, "rdp")
    assert acc.get_epsilon(delta=1e-5, **opts) == pytest.approx(p["total_epsilon"], rel=0.01)


def test_client_level_noise_on_a_few_clients_is_flagged():
    p = tiny_run(algorithm="fedavg")
    assert p["unit"] == "client" and p["claim_holds"]
    assert all(r["noise_to_signal"] > 1 for r in p["releases"] if r["dp"]) and p["warnings"]


def test_unprivatised_edge_release_breaks_the_edge_claim():
    """Only the neighbour sums noised: FedGCN's model trains GCN layers over exact local edges."""
    p = tiny_run(dp_exchanges="fedgcn/neighbour_sums", dp_budget_share="fedgcn/neighbour_sums=1")
    assert not p["claim_holds"] and "fedgcn/model" in p["uncovered"][0]
    assert [r["tag"] for r in p["releases"] if not r["covered"]] == ["fedgcn/model"]
    assert 0.99 * 4.0 <= p["total_epsilon"] <= 4.0  # the whole budget on the one DP tag


def test_conflicting_settings_are_refused():
    with pytest.raises(ConfigError, match="client cannot privatise the neighbour-sum"):
        dp_config(RunConfig(dp_epsilon=1.0, dp_unit="client"))
    assert dp_config(RunConfig(dp_epsilon=1.0, dp_unit="client", dp_exchanges="fedgcn/model")) is not None
    with pytest.raises(ConfigError, match="leaves without DP"):
        dp_config(RunConfig(dp_epsilon=1.0, dp_exchanges="fedgcn/model", dp_budget_share="fedgcn/neighbour_sums=1"))
    with pytest.raises(ConfigError, match="need --dp-epsilon"):
        RunConfig(dp_unit="edge").validate()
    for unit in ("edge", "node"):  # FedGCN's GCN reads exact edges: its model would need client-level noise
        with pytest.raises(ConfigError, match="use --algorithm fedgcn-gap"):
            dp_config(RunConfig(dp_epsilon=1.0, dp_unit=unit))
    with pytest.raises(ConfigError, match="positive shares"):
        parse_budget_shares("a=1,b")
    assert parse_budget_shares("a=3, b=1") == {"a": 3.0, "b": 1.0}


def test_leakage_matrix_marks_an_at_chance_setting():
    from secure_fgl.report.tables import leakage_matrix

    def run(eps, acc, seed):
        return {
            "config": {"algorithm": "fedgcn", "dataset": "sbm", "mode": "plain", "dp_epsilon": eps, "seed": seed},
            "final": {"test_acc": acc},
            "attacks": [],
            "num_classes": 5,
        }

    results = [run(None, 0.84, 0), run(None, 0.85, 1), run(1.0, 0.19, 0), run(1.0, 0.21, 1)]
    table = leakage_matrix(results, "fedgcn", "sbm")
    row = next(r for r in table.rows if r[0] == "model at chance?")
    assert row[table.header.index("plain ε=1")] == "AT CHANCE"
    assert row[table.header.index("plain")] == "no"


def test_headline_figure_writes_png_pdf_svg_with_a_panel_per_attack(tmp_path, monkeypatch):
    import matplotlib.figure

    from secure_fgl.report.headline import accuracy_vs_epsilon

    def run(algo, eps, acc, seed):
        attack = {"name": "link_inference", "applicable": True, "value": 0.5 + acc / 4, "chance": 0.5, "metric": "AUC"}
        return {
            "config": {
                "algorithm": algo,
                "model": "mlp",
                "dataset": "sbm",
                "mode": "plain",
                "dp_epsilon": eps,
                "seed": seed,
                "dp_unit": None,
            },
            "final": {"test_acc": acc},
            "privacy": {"unit": "edge"} if eps else None,
            "num_classes": 5,
            "attacks": [attack, {"name": "transcript_audit", "applicable": False}],
        }

    results = [run("fedgcn-gap", e, a + 0.01 * s, s) for s in (0, 1) for e, a in ((1.0, 0.6), (8.0, 0.7), (None, 0.84))]
    results += [run("fedavg", None, 0.6, s) for s in (0, 1, 2)]  # a reference line with one seed more
    drawn = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **kw: (drawn.append(fig), real_savefig(fig, *a, **kw))[1]
    )
    paths = accuracy_vs_epsilon(results, tmp_path / "fig")
    assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"] and all(p.stat().st_size > 0 for p in paths)
    acc_ax, attack_ax = drawn[0].axes  # accuracy, then one panel for the one attack
    assert "chance (1/5)" in [t.get_text() for t in acc_ax.get_legend().get_texts()]
    assert "(2-3 seed(s) a point" in acc_ax.get_title()  # not "3 seeds" for the 2-seed curve
    assert attack_ax.get_ylabel() == "AUC" and "chance (0.5)" in [
        t.get_text() for t in attack_ax.get_legend().get_texts()
    ]


def test_distributed_noise_states_the_guarantee_against_a_coalition():
    """Distributed noise states the guarantee against a coalition.

    Distributed placement (the default in secure modes) over-provisions against one colluding
    client: the coalition keeps the run's epsilon.  Calibrated for none (--dp-colluders 0), the
    section states the weaker epsilon, from the releases at their reduced noise (row sums: half
    the variance in the worst case, the model mean (K-1)/K).
    """
    from protocols.accountant import epsilon_of

    for algorithm, left in (
        ("fedgcn-gap", {"fedgcn-gap/hop/1": 0.5, "fedgcn-gap/hop/2": 0.5}),  # row sums: 1/(c+1)
        ("fedavg", {"fedavg/model": 2 / 3}),  # a model mean: (K-c)/K
    ):
        p = tiny_run(algorithm=algorithm, mode="mask")
        c = p["coalition"]
        assert p["placement"] == "distributed" and c["colluding_clients"] == c["calibrated_colluders"] == 1
        assert c["total_epsilon"] == pytest.approx(p["total_epsilon"], rel=1e-6)
        p = tiny_run(algorithm=algorithm, mode="mask", dp_colluders=0)
        c = p["coalition"]
        assert c["colluding_clients"] == 1 and c["total_epsilon"] > p["total_epsilon"]
        hist = [(r["noise_multiplier"] * left[r["tag"]] ** 0.5, 1.0, r["releases"]) for r in p["releases"] if r["dp"]]
        assert c["total_epsilon"] == pytest.approx(epsilon_of(hist, 1e-5, p["composition"]), rel=1e-9)
    assert tiny_run(algorithm="fedgcn-gap")["coalition"] is None  # plain: local noise, each adds all


def test_fedgcn_edge_level_dp_is_refused_before_the_run_starts(tmp_path):
    """One line naming fedgcn-gap, from preflight: no data loaded, no run folder written."""
    from secure_fgl.preflight import preflight

    cfg = RunConfig(dp_epsilon=4.0, out=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="use --algorithm fedgcn-gap") as err:
        preflight(cfg, check_data=False)
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()
    preflight(RunConfig(dp_epsilon=4.0, dp_exchanges="fedgcn/neighbour_sums"), check_data=False)  # sums only: runs
