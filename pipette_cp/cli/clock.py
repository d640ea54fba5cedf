"""When the command started: ``--time-limit`` counts from here (imported first)."""

import time

#: ``time.perf_counter()`` when the command line package was first imported.
STARTED_AT = time.perf_counter()
