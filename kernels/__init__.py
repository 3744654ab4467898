"""autoweb's Django-free kernel engine: problems, seeds, harness, search engine, CLI."""

__version__ = "0.1.0"
