"""cxlmpi's version (the one of pyproject.toml), in a module of its own so
that cxlmpi.select can name it without importing the package."""

__version__ = "0.1.0"
