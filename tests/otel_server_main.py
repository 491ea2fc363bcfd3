"""A real ``/chat`` server process that exports its traces over OTLP/HTTP.

``python -m tests.otel_server_main DB FD`` sets up export from the ``OTEL_*`` environment as
``datamachine serve`` does (:func:`datamachine.server.telemetry.export_from_environment`), then
serves the host as ``datamachine serve`` does (:func:`datamachine.server.app.serve`) on the
listening socket FD the test opened. The one difference: the model, the hostile suite's
``DirectiveModel``.
"""

from __future__ import annotations

import sys

import bootstrap
from datamachine.server.app import serve
from datamachine.server.telemetry import export_from_environment
from tests.hostile.server_main import DirectiveModel


def main(argv: list[str]) -> None:
    db, fd = argv[1], int(argv[2])
    # As `datamachine serve` does: export where OTEL_* says (the test sets the endpoint, the
    # service name and a short OTEL_BSP_SCHEDULE_DELAY).
    shutdown, _ = export_from_environment()
    assert shutdown is not None, "OTEL_EXPORTER_OTLP_ENDPOINT is not set"
    host = bootstrap.boot(db_path=db, plugins=[DirectiveModel()])
    serve(host, fd=fd, log_level="warning", access_log=False, on_stop=shutdown)


if __name__ == "__main__":
    main(sys.argv)
