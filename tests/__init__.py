"""The project's tests.

freezegun must leave psycopg's pool alone: its scheduler thread keeps time with
``time.monotonic``, and under a frozen clock it never wakes to stop, so every close of a
PostgreSQL host would wait out the pool's 5 s join timeout. Set here, so the child processes
the storage tests start (which import this package) get it too. psycopg itself is imported
here for the same children: its C extension must load before freezegun replaces ``datetime``.
"""

import freezegun
import psycopg  # noqa: F401

freezegun.configure(extend_ignore_list=["psycopg_pool", "psycopg"])
