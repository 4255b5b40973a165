"""A minimal GET-only HTTP server for a process's ``/metrics`` and ``/health``.

Used by the pipeline exporter (``stream.monitor``) and the trainer (``model.trainer.metrics``):
each route is a function returning ``(body, content type)``, called per request; any other
path is a 404. Threaded (``daemon_threads``): a slow scrape does not hold the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

Route = Callable[[], tuple[bytes, str]]


def routes_server(host: str, port: int, routes: Mapping[str, Route]) -> ThreadingHTTPServer:
    """A server (not started: ``serve_forever`` it) answering ``GET`` on ``routes``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                self.send_error(404)
                return
            body, ctype = route()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    return httpd
