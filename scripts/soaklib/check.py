"""The soak's checker: every invariant, read from PostgreSQL (psql) and the
stream (nats-py), on the ledger domain seawall-testbed runs (tables
`ledger_entry` and `ledger_balance`, consumers `ledger` and `hook`, stream
`LEDGER`; see tests/kit/src/ledger.rs). It runs inside a soak, or on its own against a database and
a stream that a soak left behind:

    python3 scripts/soaklib/check.py --pg-url postgres://postgres@127.0.0.1:55432 \\
        --db soak_1796079971 --nats-url nats://127.0.0.1:54300 --seed 2026 --messages 100000
"""
import argparse
import asyncio
import os
import random
import subprocess
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nats

from soaklib.common import HOOK_CONSUMER, LEDGER_CONSUMER, NATS_ERRORS, RECORDED_SUBJECT, STREAM, now
from soaklib.load import Load


# The row states of service/src/state.rs (OutboxState, ClaimState), as SQL.
# The checker names states only through this table, so it counts what the
# relay, the sweeper and the API count.
STATE = {
    "outbox_pending": "published_at IS NULL AND dead_at IS NULL",
    "outbox_published": "published_at IS NOT NULL",
    "outbox_dead": "published_at IS NULL AND dead_at IS NOT NULL",
    "claim_processed": "processed_at IS NOT NULL",
    "claim_expired": "processed_at IS NULL AND quarantined_at IS NULL AND (lease_until IS NULL OR lease_until <= now())",
}


class Checks:
    """Mixed into the soak and the standalone checker."""

    def psql(self, sql, options=None):
        """Runs `sql` on the soak's database; `options` are session settings
        (PGOPTIONS), e.g. to write while the database defaults to read-only."""
        host_port = self.args.pg_url.split("@")[-1]
        host, port = host_port.split(":")
        env = dict(os.environ, PGOPTIONS=options) if options else None
        out = subprocess.run(["psql", "-h", host, "-p", port, "-U", "postgres", "-d", self.db, "-At", "-F", "\t", "-c", sql],
                             check=True, capture_output=True, text=True, env=env).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    async def consumer_state(self):
        """Messages pending or unacknowledged, summed over both consumers."""
        nc = await nats.connect(servers=self.nats_url.split(","))
        js = nc.jetstream()
        pending = ack_pending = 0
        for name in (LEDGER_CONSUMER, HOOK_CONSUMER):
            info = await js.consumer_info(STREAM, name)
            pending += info.num_pending
            ack_pending += info.num_ack_pending
        await nc.close()
        return pending, ack_pending

    async def wait_drained(self, expected_entries, timeout):
        """Waits until every valid message is recorded, the outbox is empty and
        the consumer has nothing pending; on timeout the checker still runs
        and reports what is missing."""
        deadline = now() + timeout
        last_report = 0.0
        while now() < deadline:
            try:
                entries = int(self.psql("SELECT count(*) FROM ledger_entry")[0][0])
                pending = int(self.psql(f"SELECT count(*) FROM outbox_message WHERE {STATE['outbox_pending']}")[0][0])
                num_pending, ack_pending = await self.consumer_state()
                # In WAL mode the events wait in the slot, not in the table:
                # drained once the hook consumer has handled one per entry.
                relayed = True
                if self.args.outbox_mode == "wal":
                    notified = int(self.psql(f"SELECT count(*) FROM inbox_message WHERE consumer = '{HOOK_CONSUMER}' AND {STATE['claim_processed']}")[0][0])
                    relayed = notified >= expected_entries
                if entries >= expected_entries and pending == 0 and num_pending == 0 and ack_pending == 0 and relayed:
                    return True
                if now() - last_report > 10:
                    last_report = now()
                    self.log("waiting", f"entries {entries}/{expected_entries}, outbox pending {pending}, "
                                        f"stream pending {num_pending}, ack pending {ack_pending}")
            except (subprocess.CalledProcessError, ValueError, *NATS_ERRORS) as e:
                print("waiting:", e, flush=True)
            await asyncio.sleep(1)
        self.log("timeout", "the system did not drain in time; checking anyway")
        return False

    async def recorded_events(self):
        nc = await nats.connect(servers=self.nats_url.split(","))
        js = nc.jetstream()
        info = await js.stream_info(STREAM)
        counts = {}
        sub = await js.subscribe(RECORDED_SUBJECT, ordered_consumer=True)
        total = 0
        try:
            while True:
                msg = await sub.next_msg(timeout=5)
                total += 1
                mid = (msg.headers or {}).get("Nats-Msg-Id", "")
                counts[mid] = counts.get(mid, 0) + 1
        except nats.errors.TimeoutError:
            pass  # read to the end
        await nc.close()
        return total, counts, info.config.num_replicas

    async def check(self, valid, malformed, missing):
        failures = []

        def expect(ok, what):
            print(("  ok   " if ok else "  FAIL ") + what, flush=True)
            if not ok:
                failures.append(what)

        entries = {row[0]: (row[1], int(row[2])) for row in self.psql("SELECT message_id, account_id, amount FROM ledger_entry")}
        valid_ids = {f"soak-{i}" for i in valid}
        expect(len(entries) == len(valid_ids) and set(entries) == valid_ids,
               f"entries == distinct valid message ids ({len(entries)} entries, {len(valid_ids)} valid ids)")
        dup_entries = self.psql("SELECT message_id FROM ledger_entry GROUP BY message_id HAVING count(*) > 1")
        expect(not dup_entries, f"no message recorded twice ({len(dup_entries)} were)")
        expected_balance = {}
        for i in valid:
            expected_balance[self.account(i)] = expected_balance.get(self.account(i), 0) + self.amount(i)
        balances = {row[0]: int(row[1]) for row in self.psql("SELECT account_id, balance FROM ledger_balance")}
        expect(balances == expected_balance, f"each account's balance == the sum of its distinct entries ({len(balances)} accounts)")
        markers = self.psql(f"SELECT count(*), count(DISTINCT message_id) FROM inbox_message WHERE consumer = '{LEDGER_CONSUMER}'")[0]
        expect(int(markers[0]) == len(valid_ids) == int(markers[1]), f"each valid id has one inbox marker ({markers[0]} markers)")
        dead = self.psql("SELECT coalesce(message_id, ''), error FROM dead_letter")
        dead_ids = {row[0] for row in dead if row[0]}
        malformed_ids = {f"soak-{i}" for i in malformed}
        expect(malformed_ids <= dead_ids, f"every malformed message is dead-lettered ({len(malformed_ids & dead_ids)}/{len(malformed_ids)})")
        no_id = sum(1 for row in dead if not row[0])
        expect(no_id >= len(missing), f"every id-less message is dead-lettered ({no_id} rows for {len(missing)} messages)")
        expect(dead_ids <= malformed_ids, f"nothing else is dead-lettered ({len(dead_ids - malformed_ids)} others)")
        letters_by = dict(self.psql("SELECT consumer, count(*) FROM dead_letter GROUP BY consumer"))
        expect(set(letters_by) <= {LEDGER_CONSUMER}, f"only the {LEDGER_CONSUMER} consumer dead-letters (malformed input): {letters_by}")
        unpublished = int(self.psql(f"SELECT count(*) FROM outbox_message WHERE NOT ({STATE['outbox_published']}) AND message_id NOT LIKE 'poison-%'")[0][0])
        outbox_rows = int(self.psql("SELECT count(*) FROM outbox_message WHERE message_id NOT LIKE 'poison-%'")[0][0])
        expect(unpublished == 0, f"every outbox row is published ({unpublished} are not)")
        poison = self.psql(f"SELECT count(*), count(*) FILTER (WHERE {STATE['outbox_dead']} AND last_error IS NOT NULL) "
                           "FROM outbox_message WHERE message_id LIKE 'poison-%'")[0]
        expect(int(poison[0]) == self.poison_rows == int(poison[1]),
               f"every poison row ends dead with its error, unpublished ({poison[1]}/{self.poison_rows})")
        total, counts, replicas = await self.recorded_events()
        handed_over = None
        if self.args.outbox_mode == "wal":
            # One event per entry, as the ledger handler writes. Rows are
            # only the events the broker refused while reachable (a NATS node
            # stop), handed to the table relay; they are checked published
            # above.
            handed_over = outbox_rows
            outbox_rows = len(entries)
            print(f"  info {handed_over} event(s) went through the outbox table", flush=True)
        repeated = sum(1 for n in counts.values() if n > 1)
        expect(replicas == 3, f"the stream is replicated R{replicas}")
        expect(total == outbox_rows and repeated == 0,
               f"{RECORDED_SUBJECT} holds exactly one message per event ({total} messages, {outbox_rows} events, {repeated} repeated)")
        open_claims = int(self.psql(f"SELECT count(*) FROM inbox_message WHERE consumer = '{HOOK_CONSUMER}' AND {STATE['claim_expired']}")[0][0])
        expect(open_claims == 0, f"no claim is left open without a live owner ({open_claims} are)")
        both = int(self.psql("SELECT count(*) FROM inbox_message WHERE processed_at IS NOT NULL AND quarantined_at IS NOT NULL")[0][0])
        expect(both == 0, f"no claim is both processed and quarantined ({both} are)")
        notified = int(self.psql(f"SELECT count(*) FROM inbox_message WHERE consumer = '{HOOK_CONSUMER}' AND {STATE['claim_processed']}")[0][0])
        received = self.webhook.keys if self.webhook else None
        published = ([row[0] for row in self.psql(f"SELECT message_id FROM outbox_message WHERE {STATE['outbox_published']}")]
                     if self.args.outbox_mode == "table" else list(counts))
        missed = [k for k in published if received is not None and k not in received]
        expect(notified == outbox_rows and not missed,
               f"every event's webhook call is recorded ({notified}/{outbox_rows}; {len(missed)} never reached the receiver)")
        if self.recoveries is not None and "commit" in self.args.faults.split(","):
            expect(self.commits_cut > 0, f"the proxy cut COMMITs ({self.commits_cut})")
        panics = [name for name, path in self.logs.items() if "panicked" in open(path, errors="replace").read()]
        expect(not panics, f"no process panicked ({panics})")
        if self.recoveries is not None:
            # Each one the faults killed was started again: one gone now
            # exited on its own (a start-up that failed, say), and the soak
            # ran without it.
            exited = {name: p.poll() for name, p in self.procs.items() if p.poll() is not None}
            expect(not exited, f"every process is still running ({exited or 'none'} exited on its own)")
            for name in exited:
                # CI keeps only what the soak prints: the reason is in the log's end.
                with open(self.logs[name], errors="replace") as f:
                    tail = f.readlines()[-15:]
                print(f"  the end of {name}'s log:\n" + "".join("    " + line for line in tail), flush=True)
        if self.recoveries is not None:
            planned = len(self.planned_faults())
            expect(len(self.recoveries) >= planned, f"readyz answered after each fault ({len(self.recoveries)} recoveries)")
        # Reports from before the soak ran on the ledger (the example domain's
        # credits) call "entries" "credits" and "recorded_events"
        # "applied_events"; scripts/soak-table.py reads both spellings.
        return failures, {"entries": len(entries), "valid": len(valid_ids), "malformed": len(malformed), "missing_id": len(missing),
                          "dead_letters": len(dead), "outbox_rows": outbox_rows, "recorded_events": total,
                          "handed_to_table": handed_over,
                          "poison_rows": self.poison_rows, "commits_cut": self.commits_cut,
                          "webhook_calls": self.webhook.calls if self.webhook else None,
                          "notified": notified}

    def throughput(self):
        rows = self.psql("SELECT (extract(epoch FROM created_at)::bigint / 10) * 10 AS b, count(*) FROM ledger_entry GROUP BY b ORDER BY b")
        if not rows:
            return []
        first = int(rows[0][0])
        return [(int(b) - first, int(n) / 10) for b, n in rows]



class StandaloneCheck(Checks, Load):
    """The checker without a soak around it: the plan is recomputed from the
    seed; what only a running soak knows (webhook calls seen, recoveries,
    cut COMMITs) is not checked."""

    def __init__(self, args):
        self.args = args
        self.db = args.db
        self.nats_url = args.nats_url
        self.poison_rows = args.poison_rows
        self.commits_cut = None
        self.webhook = None
        self.recoveries = None
        self.logs = {}
        self.rng = random.Random(args.seed)

    def log(self, event, detail=""):
        print(f"{event} {detail}", flush=True)


async def standalone(args):
    checker = StandaloneCheck(args)
    valid, malformed, missing = checker.plan_messages()
    failures, counts = await checker.check(valid, malformed, missing)
    print(counts)
    return 1 if failures else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:55432")
    p.add_argument("--db", required=True)
    p.add_argument("--nats-url", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--messages", type=int, required=True)
    p.add_argument("--poison-rows", type=int, default=4)
    p.add_argument("--outbox-mode", choices=["table", "wal"], default="table")
    sys.exit(asyncio.run(standalone(p.parse_args())))
