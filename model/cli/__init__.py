"""Subcommands of ``model``: ``train``, ``models``, ``evaluate`` (registered by ``deploy.cli``).

Each module's imports are light; heavy modules are imported inside the handlers.
"""
