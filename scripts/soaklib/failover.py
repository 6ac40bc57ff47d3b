"""The failover faults: the soak's database is the Patroni cluster of
`scripts/services start ha`, reached through HAProxy's read-write port.

- switchover: `patronictl switchover`, the planned hand-over an operator runs
  for maintenance;
- failover: kill -9 of the leader's Patroni and its postmaster together, so
  the replica is promoted once the leader key expires; the killed node's
  Patroni is started again and rejoins as the replica (pg_rewind). With
  --replica-lag S the leader's WAL senders are stopped (SIGSTOP) for S
  seconds first, so the replica is S seconds behind when the leader dies, as
  on a slow or congested link; the measure of what asynchronous replication
  loses, since on loopback the replica is otherwise never behind. Patroni
  promotes no replica more than `maximum_lag_on_failover` (1 MiB) behind,
  so S stays around a second at the soak's rates.

With --outbox-mode wal the relays' slot is declared a Patroni permanent
slot once they made it: Patroni copies it to the replica and moves it there
to the leader's confirmed position, so the new leader has it after either
fault. Each fault waits, before and after, until Patroni says the replica's
copy is safe to use after a failover.

Each records its recovery times: until HAProxy routes writes to the new
leader, until the testbed's readyz answers 200, and until a ledger entry
committed after the fault is visible (processing resumed), unless every valid
message was recorded before the fault and nothing was left to resume.
"""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request

from soaklib.common import now

NODES = ("pg1", "pg2")


class Failover:
    """Mixed into the soak when it runs with --failover."""

    def patroni_config(self, node):
        return os.path.join(self.args.ha_dir, node, "patroni.yml")

    def cluster_members(self):
        """Patroni's view: member name -> (role, state)."""
        cluster = self.rest("/cluster") or {"members": []}
        return {m["name"]: (m["role"], m.get("state", "")) for m in cluster["members"]}

    def leader(self):
        members = self.cluster_members()
        return next((name for name, (role, _) in members.items() if role == "leader"), None)

    def writable_leader(self):
        """The node HAProxy's read-write port reaches, if it takes writes."""
        try:
            rows = self.psql("SELECT inet_server_port(), pg_is_in_recovery()")
        except subprocess.CalledProcessError:
            return None
        port, in_recovery = rows[0]
        return None if in_recovery == "t" else int(port)

    def wait_for(self, what, condition, timeout=120):
        """Polls `condition` until it returns something other than None or
        False (a count of 0 is an answer), and returns that."""
        deadline = now() + timeout
        while True:
            value = condition()
            if value is not None and value is not False:
                return value
            if now() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout} s")
            time.sleep(0.1)

    def rest_address(self, node):
        """host:port of the node's Patroni REST API: `restapi.listen` of its
        configuration (as `scripts/services` writes it)."""
        with open(self.patroni_config(node)) as f:
            lines = f.read().splitlines()
        section = lines.index("restapi:")
        return next(line.split()[1] for line in lines[section + 1:] if line.strip().startswith("listen:"))

    def rest(self, path):
        """GET `path` from the first Patroni REST API that answers."""
        for node in NODES:
            address = self.rest_address(node)
            try:
                with urllib.request.urlopen(f"http://{address}{path}", timeout=2) as r:
                    return json.load(r)
            except OSError:
                continue
        return None

    def replica_in_sync(self):
        """The other node streams again, and is the synchronous standby when
        the cluster runs in synchronous mode (Patroni switches over only to
        that one), so the next fault starts from a healthy pair."""
        members = self.cluster_members()
        config = self.rest("/config") or {}
        replica = "sync_standby" if config.get("synchronous_mode") else "replica"
        roles = sorted(role for role, state in members.values() if state in ("running", "streaming"))
        return roles == sorted(["leader", replica])

    def wal_slot(self):
        """The WAL relays' slot: seawall's default name for the soak's database."""
        return re.sub("[^a-z0-9]", "_", f"seawall_{self.db}".lower())

    def patroni_edit(self, *settings):
        leader = self.wait_for("a Patroni leader", self.leader)
        args = [arg for setting in settings for arg in ("-s", setting)]
        subprocess.run(["patronictl", "-c", self.patroni_config(leader), "edit-config", "--force", *args],
                       check=True, capture_output=True)

    def log_sizes(self):
        """Where each node's Patroni log ends now."""
        return {node: os.path.getsize(os.path.join(self.args.ha_dir, node, "patroni.log")) for node in NODES}

    def wait_slot_safe(self, since):
        """Waits until a replica's Patroni logs, after the log positions
        `since`, that its copy of the WAL slot is safe to use after a
        failover (the leader's catalog rows it needs are kept)."""
        line = f"Logical slot {self.wal_slot()} is safe to be used after a failover"

        def safe():
            for node, offset in since.items():
                with open(os.path.join(self.args.ha_dir, node, "patroni.log"), errors="replace") as f:
                    f.seek(offset)
                    if line in f.read():
                        return True
            return False

        self.wait_for("the replica's copy of the WAL slot safe to use", safe, timeout=180)

    def declare_permanent_slot(self):
        """The WAL relays made their slot (its publication first); Patroni
        is told to keep it on every node."""
        slot = self.wal_slot()
        self.wait_for("the WAL slot", lambda: self.psql(
            f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'")[0][0] == "1")
        since = self.log_sizes()
        self.patroni_edit(f"slots.{slot}.type=logical", f"slots.{slot}.database={self.db}",
                          f"slots.{slot}.plugin=pgoutput")
        self.wait_slot_safe(since)
        self.log("slot", f"{slot} is a Patroni permanent slot, on the replica too")

    def forget_permanent_slot(self):
        """The slot out of Patroni's configuration: Patroni then drops it."""
        self.patroni_edit(f"slots.{self.wal_slot()}=null")

    def entries(self):
        try:
            return int(self.psql("SELECT count(*) FROM ledger_entry")[0][0])
        except subprocess.CalledProcessError:
            return None

    def record_failover(self, fault, started, old_port):
        new_port = self.wait_for(f"a new writable leader after the {fault}",
                                 lambda: (p := self.writable_leader()) and p != old_port and p)
        routed = round(now() - started, 2)
        self.recoveries.append((f"{fault}: writes routed to the new leader", routed))
        self.log("recovered", f"{fault}: HAProxy routes writes to port {new_port} after {routed} s")
        # Counted once the new leader answers, so a failed query is not
        # taken for zero (the first entry would then look like a resumption).
        before = self.wait_for("the entry count on the new leader", self.entries)
        self.wait_ready(fault, started)
        if not self.load_done():
            # A fault late in the load can find every valid message recorded
            # already (only the duplicates republished after the window are
            # left, and they record nothing): nothing is left to resume then.
            def progress():
                count = self.entries() or 0
                return count if count > before or count >= self.valid_total else None

            if self.wait_for(f"an entry committed after the {fault}, or every valid message recorded",
                             progress) == before:
                self.log("recovered", f"{fault}: every valid message was recorded before it; nothing to resume")
                return
            resumed = round(now() - started, 2)
            self.recoveries.append((f"{fault}: processing resumed", resumed))
            self.log("recovered", f"{fault}: entries committed again after {resumed} s")

    def fault_switchover(self):
        self.wait_for("a healthy pair before the switchover", self.replica_in_sync, timeout=180)
        leader = self.wait_for("a Patroni leader", self.leader)
        candidate = next(n for n in NODES if n != leader)
        old_port = self.writable_leader()
        since = self.log_sizes()
        started = now()
        out = subprocess.run(["patronictl", "-c", self.patroni_config(leader), "switchover", "--leader", leader,
                              "--candidate", candidate, "--force"], capture_output=True, text=True)
        if out.returncode != 0 or "failed" in out.stdout.lower():
            raise RuntimeError(f"patronictl switchover failed: {out.stdout} {out.stderr}")
        self.log("fault", f"patronictl switchover {leader} -> {candidate}")
        self.record_failover("switchover", started, old_port)
        self.wait_for("the old leader rejoining as replica", self.replica_in_sync, timeout=180)
        if self.args.outbox_mode == "wal":
            self.wait_slot_safe(since)

    def replica_senders(self, replica):
        """The leader's WAL senders streaming to the replica (Patroni names
        each replication connection after its member); not the logical
        senders of a WAL-mode relay."""
        rows = self.psql(f"SELECT pid FROM pg_stat_replication WHERE application_name = '{replica}'")
        if not rows:
            raise RuntimeError(f"--replica-lag: no WAL sender streams to {replica}")
        return [int(row[0]) for row in rows]

    def lag_then_kill(self, leader, patroni_pid, postmaster_pid):
        """kill -9 of the leader's Patroni and postmaster; with
        --replica-lag, after its senders to the replica were stopped that
        long. Stopped senders are killed whatever happens: a stopped one
        would never notice its postmaster is gone, would hold a fast shutdown
        forever, and must not send what it holds."""
        senders = self.replica_senders(next(n for n in NODES if n != leader)) if self.args.replica_lag else []
        try:
            for pid in senders:
                os.kill(pid, signal.SIGSTOP)
            if senders:
                self.log("fault", f"{leader}'s WAL senders {senders} stopped for {self.args.replica_lag} s")
                time.sleep(self.args.replica_lag)
            started = now()
            for pid in (patroni_pid, postmaster_pid):
                os.kill(pid, signal.SIGKILL)
            self.log("fault", f"kill -9 of {leader}'s Patroni ({patroni_pid}) and postmaster ({postmaster_pid})")
            return started
        finally:
            for pid in senders:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def fault_failover(self):
        self.wait_for("a healthy pair before the failover", self.replica_in_sync, timeout=180)
        leader = self.wait_for("a Patroni leader", self.leader)
        node_dir = os.path.join(self.args.ha_dir, leader)
        old_port = self.writable_leader()
        patroni_pid = int(subprocess.run(["pgrep", "-f", f"^/usr/bin/python3 /usr/bin/patroni {self.patroni_config(leader)}$"],
                                         capture_output=True, text=True, check=True).stdout.split()[0])
        with open(os.path.join(node_dir, "data", "postmaster.pid")) as f:
            postmaster_pid = int(f.readline())
        children = subprocess.run(["pgrep", "-P", str(postmaster_pid)], capture_output=True, text=True).stdout.split()
        since = self.log_sizes()
        started = self.lag_then_kill(leader, patroni_pid, postmaster_pid)
        self.record_failover("failover", started, old_port)
        # The killed node comes back as the replica, as an operator would
        # bring it back: its Patroni rewinds it onto the new timeline.
        # Its backends exit when they notice the postmaster is gone; one left
        # behind would keep the shared memory and block the restart.
        self.wait_for("the killed postmaster's backends to exit",
                      lambda: not any(os.path.exists(f"/proc/{pid}") for pid in children))
        log = open(os.path.join(node_dir, "patroni.out"), "ab")
        proc = subprocess.Popen(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--",
                                 "patroni", self.patroni_config(leader)], stdout=log, stderr=log,
                                cwd=node_dir, start_new_session=True)
        with open(os.path.join(node_dir, "patroni.pid"), "w") as f:
            f.write(f"{proc.pid}\n")
        self.wait_for(f"{leader} rejoining as replica", self.replica_in_sync, timeout=180)
        self.log("restart", f"{leader} rejoined as replica after {now() - started:.1f} s")
        if self.args.outbox_mode == "wal":
            self.wait_slot_safe(since)
