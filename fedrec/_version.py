"""The package version (single source of truth, read by setuptools)."""

__version__ = "0.1.0"
