"""Backfill of historical logs: ``formats`` (readers of each log format), ``plan`` (rows
read, checked and ordered by event time), ``runner`` (sending the plan to ``events``,
resumable; callers import the plan's names from it too) and ``ledger`` (every event id
delivered to a topic, so a second or overlapping replay sends nothing twice); ``items`` sends
a catalogue file to the ``items`` topic (``streamrec replay --items``)."""
