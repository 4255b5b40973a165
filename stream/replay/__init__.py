"""Backfill of historical logs: ``formats`` (readers of each log format) and ``runner``
(ordering by event time and sending to ``events``, resumable)."""
