"""The version artifact and the registry of versions (numpy only; spec: ``FORMAT.md`` here).

* ``manifest`` — format constants, manifest validation and dimension checks.
* ``files`` — writing and loading one version (:class:`ServingArtifact`, what serving reads).
* ``attention`` — the attention tower's files (format 5).
* ``registry`` — publishing, listing, pinning and rolling back versions; the Redis pointer.
* ``guard_note`` — the quality guard's hold (the registry's ``GUARD.json``) as ``/health``
  reports it.

The one part of ``model`` that serving imports: it never imports TensorFlow (a test checks).
"""
