"""The REST service (see docs/DESIGN.md §4)."""

from importlib import metadata

PACKAGE = "bigs-serving"


def package_version() -> str:
    """The installed package's version (pyproject.toml): `bigs --version`, the OpenAPI document, /info."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"
