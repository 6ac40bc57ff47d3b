"""What the soak's modules share: the clock and the errors a NATS call raises."""
import asyncio
import time

import nats

# Everything a nats-py call raises when the server or cluster is not (yet)
# answering: its own errors (JetStream's included), timeouts, sockets.
NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)

PG_BIN = "/usr/lib/postgresql/15/bin"


def now():
    return time.monotonic()
