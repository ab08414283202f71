"""Paper settings shipped with the package: ``secure_fgl/configs/<name>.toml``.

``secure-fgl run --preset fedgcn-table2 --dataset citeseer`` starts from the file's settings;
a ``--config`` file and every flag override them.  The first line of each file, a comment,
describes it; ``secure-fgl algorithms NAME`` lists the presets of an algorithm.
"""

from __future__ import annotations

from pathlib import Path

from .config import load_config_file
from .validation import match_choice

PRESET_DIR = Path(__file__).parent / "configs"


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """The TOML file of preset ``name`` (close spellings accepted)."""
    return PRESET_DIR / f"{match_choice('--preset', name, tuple(preset_names()))}.toml"


def load_preset(name: str) -> dict:
    """The settings of preset ``name``."""
    return load_config_file(preset_path(name))


def preset_description(name: str) -> str:
    """The first comment line of the preset's file."""
    first = preset_path(name).read_text().splitlines()[0]
    return first.lstrip("# ").strip()


def presets_of(algorithm: str) -> list[str]:
    """Presets that run ``algorithm``."""
    return [n for n in preset_names() if load_preset(n).get("algorithm") == algorithm]
