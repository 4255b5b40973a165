"""The Flink feature job.

* ``job`` — the job graph (submitted as a file: ``flink run -py stream/flink/job.py``).
* ``functions`` — its PyFlink operator functions, thin adapters around ``feature_store.features``;
  ``stage`` — their shared state handling; ``rows`` — the records and types they exchange.
* ``rehydrate`` — the store generation: each part of the job re-writes its state into a store
  that lost writes (``feature_store/FORMAT.md``, "Generation").
* ``parse`` — ``events`` records -> events or a DLQ reason.
* ``catalogue`` — the catalogue stage: ``items`` records -> the store's catalogue, or the DLQ.
* ``submit`` — submission and job management over the cluster's REST API.
"""
