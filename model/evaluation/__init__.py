"""Test-then-train evaluation of a historical log: ``streamrec evaluate``.

* ``baselines`` — the baselines ranked next to the model.
* ``replay`` — the test-then-train replay of a historical log (the protocol).
* ``synthetic`` — a synthetic ``samples`` stream with planted preferences.
"""
