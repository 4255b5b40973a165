"""Test-then-train evaluation of a historical log: ``streamrec evaluate``.

* ``baselines`` — the baselines ranked next to the model.
* ``replay`` — the test-then-train replay of a historical log (the protocol).
* ``learners`` — the methods behind the protocol's ``Learner``: baselines and the model.
* ``served`` — the model as serving holds it after the delta stream, in each row codec
  (``streamrec evaluate --row-codec``).
* ``neighbours`` — the per-user baselines co-occurrence, popularity-damped item-kNN and
  session-kNN, numpy only.
* ``sequential`` — the per-user baseline sequential rules, numpy only.
* ``content`` — the content baseline (popularity within the user's recent categories) of a
  catalogue (``streamrec evaluate --items``), numpy only.
* ``synthetic`` — a synthetic ``samples`` stream with planted preferences.
* ``report`` — a report as the command's table and as a plot over time.
"""
