"""The package version (one place; `humanline.__version__` and run_info.json read it)."""

__version__ = "0.1.0"
