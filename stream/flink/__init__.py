"""The Flink feature job.

* ``job`` — the job graph (submitted as a file: ``flink run -py stream/flink/job.py``).
* ``functions`` — its PyFlink operator functions, thin adapters around ``feature_store.features``.
* ``parse`` — ``events`` records -> events or a DLQ reason.
* ``submit`` — submission and job management over the cluster's REST API.
"""
