"""The serving API and what runs beside it.

* ``app`` builds one worker's FastAPI app from ``deps.ServingDeps``; ``service`` is what its
  routes call, ``routes`` the API's own routes, ``features_api`` (features and the catalogue,
  ``GET /items/{id}``) and ``dashboard`` the others,
  ``middleware`` and ``fastpath`` the ASGI layers, ``errors`` the one error root.
* ``loader``, ``deltas``, ``shared_state``, ``retrieval``, ``store_health``: the served model,
  its deltas, the answer and the store's health; ``metrics`` shared by the workers.
* ``cli`` (``serve``, ``dashboard-collector``) and ``workers``: ``serve --workers N``'s
  supervision and sockets; ``balance`` evens connections out over the workers.
* ``stats``, ``cluster_stats``, ``stats_file``, ``dashboard_collector``: the dashboard's one
  collector per stack, its own process, and the snapshot serving's ``/stats`` answers with.
"""
