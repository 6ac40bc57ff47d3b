"""seawall fault-injection soak: the whole platform as separate processes,
broken on purpose while traffic flows, checked by an independent checker.

The processes are `seawall-testbed` (tests/testbed/main.rs): the platform on
the test kit's ledger domain (tests/kit/src/ledger.rs), not on the example
domain, which a fork replaces. `ledger.record` messages are recorded by the
`ledger` consumer (tables `ledger_entry` and `ledger_balance`), which emits a
`ledger.recorded` event per entry; the `hook` consumer POSTs each event to a
webhook through a two-phase claim. Stream `LEDGER` (`ledger.>`).

Topology: PostgreSQL (from scripts/services), a 3-node NATS JetStream cluster
on loopback with R3 streams, 4 `seawall-testbed consume` (the last one
reaches PostgreSQL through this script's TCP proxy, which can cut a
connection right after it forwards a COMMIT), 2 `seawall-testbed relay`, 1
`seawall-testbed api`, and a webhook receiver for the `hook` consumer's
two-phase claims. Load comes from this script's own publisher (nats-py, not
seawall's code). The checker reads PostgreSQL with psql and the stream with
nats-py. Exits non-zero on any broken invariant.

Faults: kill -9 of a consumer or relay; a NATS node stop; a PostgreSQL
restart; SIGSTOP of a consumer past the ack wait; a kill -9 of a consumer
while it holds redeliveries (the last allowed ones under a low
--max-deliver); poison rows written into outbox_message by SQL; a window in
which one consumer's handler is slower than the ack wait; COMMITs cut by the
proxy; the webhook receiver down for 10 s. The table-mode run adds a lock
storm under lock_timeout and a read-only window.

    python3 scripts/soak.py --testbed target/release/seawall-testbed --messages 100000
"""
import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time

from soaklib.check import Checks
from soaklib.cluster import Cluster, Webhook
from soaklib.common import now
from soaklib.failover import Failover
from soaklib.faults import DEFAULT_FAULTS, FAILOVER_FAULTS, FAULTS, WAL_FAULTS, Faults
from soaklib.load import Load


class Soak(Cluster, Faults, Failover, Load, Checks):
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="seawall-soak-")
        self.t0 = now()
        self.timeline = []  # (t, event, detail)
        self.recoveries = []  # (fault, seconds)
        self.procs = {}  # name -> Popen
        self.logs = {}
        self.restarts = 0
        self.nats_nodes = {}
        base = args.port_base
        self.nats_ports = [(base + i, base + 100 + i, base + 200 + i) for i in range(3)]
        self.nats_url = ",".join(f"nats://127.0.0.1:{c}" for c, _, _ in self.nats_ports)
        self.api_port = base + 300
        self.db = f"soak_{int(time.time())}"
        self.db_url = f"{args.pg_url}/{self.db}"
        self.proxy_port = base + 301
        self.proxied_db_url = f"{args.pg_url.rsplit(':', 1)[0]}:{self.proxy_port}/{self.db}"
        self.cut_commits = 0  # COMMITs the proxy still has to cut
        self.commits_cut = 0
        self.webhook = Webhook(base + 302)
        self.extra_env = {}  # per process name, for the slow-handler window

    def log(self, event, detail=""):
        t = now() - self.t0
        self.timeline.append((round(t, 2), event, detail))
        print(f"[{t:8.2f}s] {event} {detail}", flush=True)

    async def main(self):
        a = self.args
        # Separate generators: the fault thread must not change the load.
        self.rng = random.Random(a.seed)
        self.frng = random.Random(a.seed + 1)
        self.poison_rows = 0
        self.ports_free()
        self.log("start", f"{a.messages} messages, seed {a.seed}, dir {self.dir}")
        await self.start_proxy()
        self.webhook.start()
        port = a.pg_url.rsplit(":", 1)[1]
        for sql in [f"CREATE DATABASE {self.db}",
                    # The test cluster runs with synchronous_commit=off for speed; an
                    # immediate restart then loses commits that were already
                    # acknowledged (and so acked at the broker). Exactly-once needs
                    # durable commits, so the soak database turns it back on.
                    f"ALTER DATABASE {self.db} SET synchronous_commit = on"]:
            subprocess.run(["psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-c", sql], check=True, stdout=subprocess.DEVNULL)
        for i in range(3):
            self.start_nats(i)
        for i in range(3):
            self.wait_nats(i)
        await self.wait_cluster()
        self.log("nats", "3-node JetStream cluster up")
        # The first consumer, alone, creates the ledger's tables (the testbed
        # does at start-up: they are no migration, so there is no `migrate`
        # step), applies the migrations and provisions the R3 stream and the
        # durable consumers. The others start once it has: two creating the
        # same table at once can fail in PostgreSQL.
        self.spawn("consume1", "consume")
        await self.wait_started(["consume1"], self.provisioned)
        self.spawn("api1", "api")
        await self.wait_started(["consume1", "api1"], self.readyz)
        for name, cmd in [("consume2", "consume"), ("consume3", "consume"), ("consume4", "consume"), ("relay1", "relay"), ("relay2", "relay")]:
            self.spawn(name, cmd)
        # No fault before every process is past its start-up: the first one,
        # the proxy cutting COMMITs, would otherwise cut consume4's migration
        # transaction (the testbed creates its tables first, so it starts
        # slower than `seawall` did) and stop it for the whole soak.
        await self.wait_started(list(self.procs), lambda: all(self.running(n) for n in self.procs))
        self.log("testbed", "4 consume, 2 relay, 1 api running")
        if a.failover and a.outbox_mode == "wal":
            self.declare_permanent_slot()
        valid, malformed, missing = self.plan_messages()
        self.valid_total = len(valid)
        load_seconds = a.messages / a.rate
        done = {"flag": False}
        loop = asyncio.get_running_loop()
        faults = loop.run_in_executor(None, self.run_faults, load_seconds, lambda: done["flag"])
        load_started = now()
        republished = await self.publish(valid, malformed, missing)
        done["flag"] = True
        await faults
        self.log("load", f"done in {now() - load_started:.1f} s")
        drained = await self.wait_drained(len(valid), a.drain_timeout)
        self.log("drained" if drained else "not drained")
        failures, counts = await self.check(valid, malformed, missing)
        if not drained:
            failures.append("the system did not drain within the timeout")
        counts["republished_after_window"] = republished
        counts["process_restarts"] = self.restarts
        report = {"counts": counts, "faults": self.timeline, "recoveries": self.recoveries,
                  "throughput_per_10s": self.throughput(), "failures": failures}
        self.stop_all()
        if a.outbox_mode == "wal":
            if a.failover:
                self.forget_permanent_slot()
            # The slot would keep the shared cluster's WAL from now on.
            port = a.pg_url.rsplit(":", 1)[1]
            subprocess.run(["psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-c",
                            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{self.db}'"],
                           stdout=subprocess.DEVNULL)
        with open(a.report, "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps({"counts": counts, "recoveries": self.recoveries}, indent=2))
        if failures:
            print(f"SOAK FAILED: {len(failures)} invariant(s) broken; logs in {self.dir}")
            return 1
        print(f"SOAK PASSED; report in {a.report}")
        shutil.rmtree(self.dir, ignore_errors=True)
        return 0


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--testbed", dest="binary", required=True,
                   help="the seawall-testbed binary (the platform on the test kit's ledger domain)")
    p.add_argument("--nats-server", required=True)
    p.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:55432")
    p.add_argument("--pg-data", help="data directory of that cluster, for the restart fault")
    p.add_argument("--failover", action="store_true",
                   help="the database is the Patroni cluster of `scripts/services start ha` behind HAProxy "
                        "(--pg-url its read-write port): switchover and failover replace the restart")
    p.add_argument("--ha-dir", help="that cluster's directory (SEAWALL_HA_DIR), with --failover")
    p.add_argument("--replica-lag", type=float, default=0.0,
                   help="seconds the leader's WAL senders are stopped before the failover's kill -9, so the replica "
                        "is that far behind (what asynchronous replication loses; see soaklib/failover.py)")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=500.0, help="messages per second published")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--faults", help="which of " + ",".join(FAULTS) + " to inject (kills: --kills); default "
                   + ",".join(DEFAULT_FAULTS) + ", with --outbox-mode wal " + ",".join(WAL_FAULTS)
                   + ", or with --failover " + ",".join(FAILOVER_FAULTS))
    p.add_argument("--max-deliver", type=int, default=5, help="SEAWALL_MAX_DELIVER: the app's give-up point")
    p.add_argument("--outage", type=float, default=3.0, help="seconds a NATS node stays down")
    p.add_argument("--window-ms", type=int, default=20_000, help="JetStream duplicate window")
    p.add_argument("--ack-wait-ms", type=int, default=3_000)
    p.add_argument("--drain-timeout", type=float, default=180)
    p.add_argument("--port-base", type=int, default=54300)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--report", default="soak-report.json")
    p.add_argument("--outbox-mode", choices=["table", "wal"], default="table",
                   help="SEAWALL_OUTBOX_MODE: outbox rows, or events in PostgreSQL's WAL relayed from a slot")
    args = p.parse_args()
    if args.faults is None:
        if args.failover:
            args.faults = ",".join(FAILOVER_FAULTS)
        elif args.outbox_mode == "wal":
            args.faults = ",".join(WAL_FAULTS)
        else:
            args.faults = ",".join(DEFAULT_FAULTS)
    chosen = set(args.faults.split(","))
    if args.failover and not args.ha_dir:
        p.error("--failover needs --ha-dir")
    if chosen & {"switchover", "failover"} and not args.failover:
        p.error("the switchover and failover faults need --failover")
    if "pg" in chosen and not args.pg_data:
        p.error("the pg fault needs --pg-data")
    return args


if __name__ == "__main__":
    soak = Soak(parse())
    code = 1
    try:
        code = asyncio.run(soak.main())
    finally:
        if code != 0:
            soak.stop_all()
            print(f"SOAK FAILED; logs in {soak.dir}")
    sys.exit(code)
