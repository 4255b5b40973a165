"""Subcommands of ``model``: ``train``, ``models``, ``evaluate`` (registered by ``deploy.cli``).

``evaluate_config`` assembles an evaluate run's configuration from its flags. Each module's
imports are light; heavy modules are imported inside the handlers.
"""
