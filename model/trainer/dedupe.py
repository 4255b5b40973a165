"""Drop training samples whose ``sample_id`` was already trained, however long ago.

Repeats reach the trainer two ways: the Flink feature job writes samples at least once (after
a restart from a checkpoint it emits again the samples of the events it had processed after
that checkpoint, same ``sample_id`` = the event's ``event_id``), and a historical log replayed
again yields the same event ids (``stream/replay/formats.py``), months of samples later. So the
trainer keeps *every* trained id, not a recent window: :class:`TrainedIds` is a
``streamrec.idset.IdSet`` (8 bytes per trained sample: 8 MB per million), saved in the
trainer checkpoint with the model and the offsets, so a restart neither forgets nor
double-counts. (A log replayed again does not even reach the trainer: the replay ledger,
``stream.replay.ledger``, does not send rows it delivered before.)
"""

from __future__ import annotations

from streamrec.idset import IdSet, id_hash, id_hashes

#: The trainer's set of trained sample ids.
TrainedIds = IdSet

__all__ = ["TrainedIds", "id_hash", "id_hashes"]
