"""The package's version and typing marker come from its metadata and ship with it."""

from importlib import metadata
from pathlib import Path

import secure_fgl


def test_version_is_the_installed_package_metadata():
    try:
        expected = metadata.version("secure-fgl")
    except metadata.PackageNotFoundError:  # a source checkout that was not pip-installed
        expected = "0+unknown"
    assert secure_fgl.__version__ == expected


def test_every_package_ships_a_py_typed_marker():
    import attacks
    import protocols

    for package in (secure_fgl, protocols, attacks):
        assert (Path(package.__file__).parent / "py.typed").is_file()
