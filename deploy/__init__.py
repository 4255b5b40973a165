"""The top of the runtime ladder: the ``streamrec`` command and the local stack it runs.

* ``cli`` — the command, registering every package's subcommands; ``cli_stack`` (``up``,
  ``down``, ``status``, ``bench``) and ``cli_backfill`` (``replay --follow``).
* ``components`` — what the local stack runs; ``stack`` — start, check and stop each as a
  supervised process (``process``: pid files, logs, process groups).
* ``demo`` — the live demo of ``make run``.
* Beside the code: the JVM artifacts (``jvm/``), Prometheus rules, the Dockerfile.
"""
