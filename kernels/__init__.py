"""autoweb's Django-free kernel engine: problems, seeds, harness, tuner, CLI."""

__version__ = "0.1.0"
