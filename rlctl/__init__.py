"""rlctl: run distributed reinforcement-learning jobs from declarative TOML job files."""

__version__ = "0.1.0"
