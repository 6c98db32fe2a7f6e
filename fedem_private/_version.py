"""The package version (a leaf module: imports nothing)."""

__version__ = "0.1.0"
