"""What the soak's modules share: the clock, the errors a NATS call raises,
and the names of the ledger domain (tests/kit/src/ledger.rs) it runs on."""
import asyncio
import time

import nats

# Everything a nats-py call raises when the server or cluster is not (yet)
# answering: its own errors (JetStream's included), timeouts, sockets.
NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)

PG_BIN = "/usr/lib/postgresql/15/bin"

# The ledger domain of seawall-testbed (tests/kit/src/ledger.rs).
STREAM = "LEDGER"  # LEDGER_STREAM, subjects ledger.>
RECORD_SUBJECT = "ledger.record"  # requests, handled by the ledger consumer
RECORDED_SUBJECT = "ledger.recorded"  # its events, handled by the hook consumer
LEDGER_CONSUMER = "ledger"  # records entries: ledger_entry, ledger_balance
HOOK_CONSUMER = "hook"  # POSTs each recorded event (TESTBED_WEBHOOK_URL)


def now():
    return time.monotonic()
