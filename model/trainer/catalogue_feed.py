"""The catalogue, live: the ``items`` topic read on a thread for the trainer's attribute slots.

With ``ModelConfig.attr_tokens`` > 0 the trainer gives every catalogued item its attributes
(``TrainerTables.set_catalogue``), so an item posted to ``POST /items`` is a candidate with
a vector before anybody clicks it, reaching serving with the next delta. :class:`CatalogueFeed`
reads the whole ``items`` topic from its beginning at every start (a catalogue is small next
to the events, and the topic is what the catalogue *is*: no offsets to keep), checks each
record as the feature job does (``stream.items.parse_item_record``) and keeps, per item, the
record the online store keeps (``feature_store/FORMAT.md``): an older ``ts`` is skipped, and
of two with the same ``ts`` the later in the topic wins.
The training thread takes what arrived (:meth:`CatalogueFeed.take`) between chunks: the TF
tables are written on that thread only, and an error that stopped the feed is raised there
(the trainer stops, as on a failed samples fetch). A record that does not check is counted
and logged (the feature job dead-letters it; the trainer does not send it twice).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from feature_store.catalogue import FeatureSpec
from stream.items import BadItem, parse_item_record

log = logging.getLogger(__name__)


class CatalogueFeed:
    """Catalogue records of the ``items`` topic, newest per item, for the training thread."""

    def __init__(
        self, open_source: Callable[[], Any], spec: FeatureSpec,
        poll_timeout_s: float = 0.2,
    ) -> None:
        """``open_source``: makes a ``fetch_thread.RecordSource`` assigned every partition of
        the items topic at its beginning (called on the feed's thread)."""
        self._open = open_source
        self.spec = spec
        self.poll_timeout_s = poll_timeout_s
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}
        #: Newest ``ts`` kept per item id (only-if-newer).
        self._newest: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Records read, and those that did not check.
        self.records = 0
        self.rejected = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="catalogue-feed", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        try:
            source = self._open()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread (take)
            self.error = exc
            return
        try:
            while not self._stop.is_set():
                polled = source.poll(self.poll_timeout_s)
                if polled is not None:
                    self.offer(polled.values)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread (take)
            self.error = exc
        finally:
            source.close()

    def offer(self, values: list[Any]) -> None:
        """Check records (wire values of the topic) and keep each item's newest."""
        for value in values:
            self.records += 1
            try:
                item = parse_item_record(value, self.spec)
            except BadItem as exc:
                self.rejected += 1
                log.warning("catalogue record skipped: %s", exc)
                continue
            with self._lock:
                if item["ts"] < self._newest.get(item["item_id"], -1):
                    continue
                self._newest[item["item_id"]] = item["ts"]
                self._pending.pop(item["item_id"], None)  # arrival order: the latest's
                self._pending[item["item_id"]] = item

    def take(self) -> list[dict[str, Any]]:
        """The records kept since the last call (one per item), in the order their latest
        arrived; raises what stopped the feed's thread."""
        if self.error is not None:
            raise self.error
        with self._lock:
            out = list(self._pending.values())
            self._pending = {}
        return out
