"""Subcommands of ``stream``: ``ingest-api``, ``replay``, ``features``, ``simulate``.

Each module's imports are light; heavy modules are imported inside the handlers.
"""
