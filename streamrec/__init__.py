"""The bottom rung of streamrec: its kernel, and the client its users import.

* ``settings`` — the one frozen settings object of a process (every default lives there);
  ``trainer_settings`` — its trainer section, the one default of every trainer knob.
* ``ids`` — id hashing; ``idset`` — an exact set of 64-bit id hashes (trained samples,
  replayed events); ``atomic`` — durable atomic file writes; ``ports`` — free TCP ports
  for the stacks and clusters started on this host (drawn below the ephemeral range).
* ``metric_names`` — every Prometheus metric name streamrec exports, defined once.
* ``client`` — the Python client of the HTTP APIs: a leaf that imports nothing of ours (only
  ``httpx``), so the simulator, the demo and the benchmarks use it as any user would.

Every package may import this one; the kernel modules import only each other.
"""
