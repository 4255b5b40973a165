"""Backfill of historical logs: ``formats`` (readers of each log format), ``runner``
(ordering by event time and sending to ``events``, resumable) and ``ledger`` (every event id
delivered to a topic, so a second or overlapping replay sends nothing twice)."""
