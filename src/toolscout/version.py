"""The version of toolscout (read by the packaging metadata, saved artefacts and the servers)."""

__version__ = "0.1.0"
