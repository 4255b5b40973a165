"""streamrec for its users: :mod:`streamrec.client`, the Python client of the HTTP APIs.

The package imports nothing else of streamrec (only ``httpx``), so it is the bottom rung of the
dependency ladder: the simulator, the demo and the benchmarks use it as any user would.
"""
