"""The faults the soak injects while traffic flows, and the table that names
them (`--faults`)."""
import signal
import subprocess
import time

from soaklib.common import PG_BIN, RECORDED_SUBJECT, now

# One table: a fault's name on the command line, and the method that injects
# it. "kill" is run --kills times; the others once each when named.
FAULTS = {
    "kill": "fault_kill",
    "nats": "fault_nats",
    "pg": "fault_pg",
    "pause": "fault_pause",
    "lastkill": "fault_lastkill",
    "poison": "fault_poison",
    "slow": "fault_slow",
    "commit": "fault_commit",
    "lockstorm": "fault_lockstorm",
    "readonly": "fault_readonly",
    "webhook": "fault_webhook",
    # Only with --failover (soaklib/failover.py): the database is a Patroni cluster.
    "switchover": "fault_switchover",
    "failover": "fault_failover",
}
# The faults run unless --faults names others: a failover soak replaces the
# single server's restart with the cluster's switchover and failover.
DEFAULT_FAULTS = [f for f in FAULTS if f not in ("switchover", "failover")]
# Faults that change the database's settings run in the table-mode soak on
# the single server only: the WAL and failover soaks restart processes on
# schedules of their own, and CI's time goes to those.
DATABASE_SETTING_FAULTS = ("lockstorm", "readonly")
WAL_FAULTS = [f for f in DEFAULT_FAULTS if f not in DATABASE_SETTING_FAULTS]
FAILOVER_FAULTS = [f for f in FAULTS if f != "pg" and f not in DATABASE_SETTING_FAULTS]


class Faults:
    """Mixed into the soak: each fault, and the schedule that runs them."""

    def fault_kill(self):
        name = self.frng.choice([n for n in self.procs if n.startswith(("consume", "relay"))])
        started = now()
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        self.log("fault", f"kill -9 {name}")
        self.spawn(name, name.rstrip("0123456789"))
        self.restarts += 1
        self.log("restart", name)
        self.wait_ready(f"kill -9 {name}", started)

    def fault_nats(self):
        i = self.frng.randrange(3)
        started = now()
        self.nats_nodes[i].send_signal(signal.SIGTERM)
        self.nats_nodes[i].wait()
        self.log("fault", f"nats node {i} stopped")
        time.sleep(self.args.outage)
        self.start_nats(i)
        self.wait_nats(i)
        self.log("restart", f"nats node {i}")
        self.wait_ready(f"nats node {i} stop", started)

    def fault_pg(self):
        started = now()
        subprocess.run(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--",
                        f"{PG_BIN}/pg_ctl", "-D", self.args.pg_data, "-m", "immediate", "-w", "restart"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
        self.log("fault", "PostgreSQL restarted (-m immediate)")
        self.wait_ready("PostgreSQL restart", started)

    def fault_pause(self):
        name = self.frng.choice([n for n in self.procs if n.startswith("consume")])
        started = now()
        pause = self.args.ack_wait_ms / 1000 + 1.5
        self.procs[name].send_signal(signal.SIGSTOP)
        self.log("fault", f"SIGSTOP {name} for {pause:.1f} s (past the ack wait)")
        time.sleep(pause)
        self.procs[name].send_signal(signal.SIGCONT)
        self.log("resume", f"SIGCONT {name}")
        self.wait_ready(f"SIGSTOP {name}", started)

    def fault_lastkill(self):
        """Freezes one consumer past the ack wait, so its deliveries go to the
        others as redeliveries (the last allowed ones under a low
        --max-deliver), then kills one of those others while it holds them."""
        frozen, victim = self.frng.sample([n for n in self.procs if n.startswith("consume")], 2)
        started = now()
        self.procs[frozen].send_signal(signal.SIGSTOP)
        time.sleep(self.args.ack_wait_ms / 1000 + 0.5)
        self.procs[victim].send_signal(signal.SIGKILL)
        self.procs[victim].wait()
        self.procs[frozen].send_signal(signal.SIGCONT)
        self.log("fault", f"kill -9 {victim} while it held {frozen}'s redeliveries")
        self.spawn(victim, "consume")
        self.restarts += 1
        self.wait_ready(f"kill -9 {victim} on redeliveries", started)

    def fault_poison(self):
        """Rows a buggy service or a manual fix could write: async-nats would
        panic on each of them."""
        started = now()
        rows = [("poison-space-name", '{"bad name": "v"}'), ("poison-crlf-value", '{"x-note": "a\\r\\nb"}'),
                ("poison-newline-id" + "\n" + "x", "{}"), ("poison-array", '["x"]')]
        for message_id, headers in rows:
            escaped = message_id.replace("'", "''").replace("\n", "' || chr(10) || '")
            self.psql("INSERT INTO outbox_message (message_id, subject, payload, headers, created_at, attempts, next_attempt_at) "
                      f"VALUES ('{escaped}', '{RECORDED_SUBJECT}', '\\x7b7d', '{headers}', now(), 0, now())")
        self.poison_rows += len(rows)
        self.log("fault", f"{len(rows)} poison rows written into outbox_message")
        self.wait_ready("poison rows", started)

    def fault_slow(self):
        """One consumer's handler slower than the ack wait for a while: its
        in-progress acks must keep its deliveries from racing themselves."""
        name = self.frng.choice([n for n in self.procs if n.startswith("consume")])
        started = now()
        work_ms = self.args.ack_wait_ms + 1000
        # The ledger handler sleeps this long after its writes, inside its transaction.
        self.restart_with(name, {"TESTBED_WORK_MS": str(work_ms)})
        self.log("fault", f"{name} handles each message in {work_ms} ms (ack wait {self.args.ack_wait_ms} ms)")
        time.sleep(2 * work_ms / 1000)
        self.restart_with(name, {})
        self.log("restore", f"{name} at normal speed")
        self.wait_ready(f"slow handler in {name}", started)

    def with_database_setting(self, setting, reset, action):
        """Sets `setting` on the soak's database, reconnects every session so
        the processes pick it up, runs `action`, then resets it the same way."""
        others = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        # Its own sessions write and wait whatever the database's defaults are.
        own = "-c default_transaction_read_only=off -c lock_timeout=0"
        self.psql(f'ALTER DATABASE "{self.db}" SET {setting}', own)
        self.psql(others, own)
        try:
            action()
        finally:
            self.psql(f'ALTER DATABASE "{self.db}" RESET {reset}', own)
            self.psql(others, own)

    def fault_lockstorm(self):
        """An operator's migration holding the ledger's tables while the
        database enforces lock_timeout: every handler meets 55P03 for the
        whole hold, which must spend no delivery and dead-letter nothing."""
        started = now()
        hold = 10
        own_session = "-c lock_timeout=0"
        self.with_database_setting(
            "lock_timeout = '200ms'", "lock_timeout",
            lambda: self.psql("BEGIN; LOCK TABLE ledger_entry, ledger_balance IN ACCESS EXCLUSIVE MODE; "
                              f"SELECT pg_sleep({hold}); COMMIT", own_session))
        self.log("fault", f"ledger tables locked for {hold} s under lock_timeout = 200ms")
        self.wait_ready("lock storm", started)

    def fault_readonly(self):
        """The database read-only for a while (default_transaction_read_only,
        as an operator sets it to stop writes): every write meets 25006 while
        the server answers and is no standby."""
        started = now()
        window = 10
        self.with_database_setting(
            "default_transaction_read_only = on", "default_transaction_read_only",
            lambda: time.sleep(window))
        self.log("fault", f"database read-only for {window} s")
        self.wait_ready("read-only database", started)

    def fault_webhook(self):
        """The hook consumer's receiver down (connections refused) for 10 s,
        more than three ack waits: every effect meets an outage of its
        target, which must spend no delivery, quarantine no claim and
        dead-letter nothing; each event is delivered once the receiver is
        back."""
        started = now()
        window = 10
        self.webhook.stop()
        self.log("fault", f"webhook receiver down for {window} s")
        time.sleep(window)
        self.webhook.start()
        self.log("restore", "webhook receiver back")
        self.wait_ready("webhook receiver down", started)

    def restart_with(self, name, env):
        self.procs[name].send_signal(signal.SIGTERM)
        try:
            self.procs[name].wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.log("fault", f"{name} did not stop within 60 s of SIGTERM; killing it")
            self.procs[name].kill()
            self.procs[name].wait()
        self.extra_env[name] = env
        self.spawn(name, "consume")
        self.restarts += 1

    def fault_commit(self):
        """The proxy in front of consume4 cuts the connection right after
        forwarding each of the next COMMITs: committed, never confirmed."""
        started = now()
        self.cut_commits += 5
        deadline = now() + 30
        while self.cut_commits > 0 and now() < deadline:
            time.sleep(0.1)
        self.log("fault", f"COMMITs cut by the proxy so far: {self.commits_cut}")
        self.wait_ready("cut COMMITs", started)

    def planned_faults(self):
        """The faults of this run: --kills kills and each --faults name once."""
        chosen = self.args.faults.split(",")
        return ["kill"] * self.args.kills + [f for f in FAULTS if f != "kill" and f in chosen]

    def run_faults(self, duration, stop):
        self.load_done = stop
        plan = self.planned_faults()
        self.frng.shuffle(plan)
        # The proxy can only cut COMMITs, and a failover only meets open
        # transactions, while messages still arrive: those faults go first,
        # during the load.
        for early in ("switchover", "failover", "commit"):
            if early in plan:
                plan.remove(early)
                plan.insert(0, early)
        gap = max(duration / (len(plan) + 1), 1.0)
        for fault in plan:
            deadline = now() + self.frng.uniform(0.5, 1.5) * gap
            while now() < deadline and not stop():
                time.sleep(0.1)
            getattr(self, FAULTS[fault])()

