"""A worker process of the queue tests: ``python -m tests.queue.worker_main URL LOG
CONCURRENCY STALLED_AFTER``, exactly what ``datamachine worker`` runs, on a host that also has
the test model (``slow_model``)."""

from __future__ import annotations

import sys

import bootstrap
from datamachine.job_worker import run_worker
from tests.queue.slow_model import SlowModel


def main() -> None:
    url, log, concurrency, stalled_after = sys.argv[1:5]
    host = bootstrap.boot(db_path=url, load_entrypoints=False, plugins=[SlowModel(log)])
    try:
        run_worker(host, concurrency=int(concurrency), stalled_after=float(stalled_after),
                   heartbeat=float(stalled_after) / 4, poll_interval=0.1)
    finally:
        host.close()


if __name__ == "__main__":
    main()
