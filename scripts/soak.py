"""seawall fault-injection soak: the whole platform as separate processes,
broken on purpose while traffic flows, checked by an independent checker.

Topology: PostgreSQL (from scripts/services), a 3-node NATS JetStream cluster
on loopback with R3 streams, 4 `seawall consume` (the last one reaches
PostgreSQL through this script's TCP proxy, which can cut a connection right
after it forwards a COMMIT), 2 `seawall relay`, 1 `seawall api`, and a
webhook receiver for the `notify` consumer's two-phase claims. Load comes from
this script's own publisher (nats-py, not seawall's code). The checker reads
PostgreSQL with psql and the stream with nats-py. Exits non-zero on any broken
invariant.

Faults: kill -9 of a consumer or relay; a NATS node stop; a PostgreSQL
restart; SIGSTOP of a consumer past the ack wait; a kill -9 of a consumer
while it holds redeliveries (the last allowed ones under a low
--max-deliver); poison rows written into outbox_message by SQL; a window in
which one consumer's handler is slower than the ack wait; COMMITs cut by the
proxy.

    python3 scripts/soak.py --seawall target/release/seawall --messages 100000
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nats
from nats.js.api import StreamConfig

PG_BIN = "/usr/lib/postgresql/15/bin"


def now():
    return time.monotonic()


class Webhook:
    """The notify consumer's receiver: answers 200 and remembers each
    Idempotency-Key it saw."""

    def __init__(self, port):
        self.port = port
        self.url = f"http://127.0.0.1:{port}/hook"
        self.keys = set()
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                outer.keys.add(self.headers.get("Idempotency-Key", ""))
                outer.calls += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


class Soak:
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

    # ---- NATS cluster -------------------------------------------------
    def ports_free(self):
        """Refuses to start over servers left by an earlier soak that was
        killed: its stream would mix old messages into this run's checks."""
        import socket
        # (The webhook receiver has bound its own port already.)
        ports = [p for ports in self.nats_ports for p in ports] + [self.api_port, self.proxy_port]
        for port in ports:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    raise RuntimeError(f"port {port} is in use (a nats-server of an earlier soak?); stop it first")

    def start_nats(self, i):
        client, cluster, mon = self.nats_ports[i]
        routes = ",".join(f"nats-route://127.0.0.1:{c}" for j, (_, c, _) in enumerate(self.nats_ports) if j != i)
        store = os.path.join(self.dir, f"nats{i}")
        os.makedirs(store, exist_ok=True)
        log = open(os.path.join(self.dir, f"nats{i}.log"), "ab")
        self.nats_nodes[i] = subprocess.Popen(
            [self.args.nats_server, "-a", "127.0.0.1", "-p", str(client), "-m", str(mon), "-js", "-sd", store,
             "-n", f"soak-{i}", "--cluster_name", "soak", "--cluster", f"nats://127.0.0.1:{cluster}", "--routes", routes],
            stdout=log, stderr=log)

    def wait_nats(self, i, timeout=60):
        mon = self.nats_ports[i][2]
        deadline = now() + timeout
        while now() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mon}/healthz?js-enabled-only=true", timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"nats node {i} did not become healthy")

    async def wait_cluster(self):
        deadline = now() + 90
        while True:
            try:
                nc = await nats.connect(self.nats_url.split(",")[0], connect_timeout=2)
                js = nc.jetstream()
                await js.add_stream(StreamConfig(name="SOAK_PROBE", subjects=["soak.probe"], num_replicas=3))
                await js.delete_stream("SOAK_PROBE")
                await nc.close()
                return
            except Exception as e:
                if now() > deadline:
                    raise RuntimeError(f"JetStream cluster not ready: {e}")
                await asyncio.sleep(0.5)

    # ---- seawall processes ---------------------------------------------
    def env(self, name=""):
        env = dict(os.environ)
        env.update({
            # The last consumer goes through the proxy that cuts COMMITs.
            "SEAWALL_DATABASE_URL": self.proxied_db_url if name == "consume4" else self.db_url,
            "SEAWALL_NATS_URL": self.nats_url,
            "SEAWALL_STREAM_REPLICAS": "3",
            "SEAWALL_DUPLICATE_WINDOW_MS": str(self.args.window_ms),
            # The lease is a tenth of the window: a row republished after a relay
            # was killed (or after a PubAck lost in a NATS outage) must land
            # inside the window, with room for the retry backoff.
            "SEAWALL_RELAY_LEASE_MS": str(self.args.window_ms // 10),
            "SEAWALL_RELAY_RETRY_MAX_MS": str(self.args.window_ms // 4),
            "SEAWALL_ACK_WAIT_MS": str(self.args.ack_wait_ms),
            "SEAWALL_MAX_DELIVER": str(self.args.max_deliver),
            "SEAWALL_NOTIFY_WEBHOOK_URL": self.webhook.url,
            "SEAWALL_CLAIM_LEASE_MS": str(self.args.ack_wait_ms),
            "SEAWALL_STREAM_MAX_AGE_MS": "86400000",
            "SEAWALL_RELAY_POLL_MS": "200",
            "SEAWALL_API_ADDR": f"127.0.0.1:{self.api_port}",
            "SEAWALL_LOG": "info",
        })
        env.update(self.extra_env.get(name, {}))
        return env

    def spawn(self, name, command):
        path = os.path.join(self.dir, f"{name}.log")
        log = open(path, "ab")
        self.logs[name] = path
        self.procs[name] = subprocess.Popen([self.args.seawall, command], env=self.env(name), stdout=log, stderr=log)

    def readyz(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/readyz", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def wait_ready(self, fault, started):
        deadline = now() + 120
        while not self.readyz():
            if now() > deadline:
                raise RuntimeError(f"API not ready 120 s after {fault}")
            time.sleep(0.1)
        secs = round(now() - started, 2)
        self.recoveries.append((fault, secs))
        self.log("recovered", f"{fault}: readyz after {secs} s")

    # ---- faults --------------------------------------------------------
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
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
                      f"VALUES ('{escaped}', 'credits.applied', '\\x7b7d', '{headers}', now(), 0, now())")
        self.poison_rows += len(rows)
        self.log("fault", f"{len(rows)} poison rows written into outbox_message")
        self.wait_ready("poison rows", started)

    def fault_slow(self):
        """One consumer's handler slower than the ack wait for a while: its
        in-progress acks must keep its deliveries from racing themselves."""
        name = self.frng.choice([n for n in self.procs if n.startswith("consume")])
        started = now()
        work_ms = self.args.ack_wait_ms + 1000
        self.restart_with(name, {"SEAWALL_DEMO_WORK_MS": str(work_ms)})
        self.log("fault", f"{name} handles each message in {work_ms} ms (ack wait {self.args.ack_wait_ms} ms)")
        time.sleep(2 * work_ms / 1000)
        self.restart_with(name, {})
        self.log("restore", f"{name} at normal speed")
        self.wait_ready(f"slow handler in {name}", started)

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

    FAULTS = ("nats", "pg", "pause", "lastkill", "poison", "slow", "commit")

    def run_faults(self, duration, stop):
        plan = ["kill"] * self.args.kills + [f for f in self.FAULTS if f in self.args.faults.split(",")]
        self.frng.shuffle(plan)
        gap = max(duration / (len(plan) + 1), 1.0)
        actions = {"kill": self.fault_kill, "nats": self.fault_nats, "pg": self.fault_pg, "pause": self.fault_pause,
                   "lastkill": self.fault_lastkill, "poison": self.fault_poison, "slow": self.fault_slow,
                   "commit": self.fault_commit}
        for fault in plan:
            deadline = now() + self.frng.uniform(0.5, 1.5) * gap
            while now() < deadline and not stop():
                time.sleep(0.1)
            actions[fault]()

    # ---- the COMMIT-cutting proxy ------------------------------------------
    async def start_proxy(self):
        upstream_host, upstream_port = self.args.pg_url.split("@")[-1].split(":")

        async def pipe(reader, writer, watch_commits, other):
            try:
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    writer.write(data)
                    await writer.drain()
                    if watch_commits and b"COMMIT" in data and self.cut_commits > 0:
                        self.cut_commits -= 1
                        self.commits_cut += 1
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()
                other.close()

        async def handle(client_reader, client_writer):
            try:
                server_reader, server_writer = await asyncio.open_connection(upstream_host, int(upstream_port))
            except OSError:
                client_writer.close()
                return
            try:
                await asyncio.gather(pipe(client_reader, server_writer, True, client_writer),
                                     pipe(server_reader, client_writer, False, server_writer))
            except asyncio.CancelledError:
                # The soak is ending; its connections end with it.
                client_writer.close()
                server_writer.close()

        self.proxy = await asyncio.start_server(handle, "127.0.0.1", self.proxy_port)

    # ---- load ------------------------------------------------------------
    def plan_messages(self):
        n = self.args.messages
        valid, malformed, missing = [], [], []
        for i in range(n):
            r = self.rng.random()
            if r < 0.01:
                malformed.append(i)
            elif r < 0.015:
                missing.append(i)
            else:
                valid.append(i)
        return valid, malformed, missing

    @staticmethod
    def account(i):
        return f"acct-{i % 50}"

    @staticmethod
    def amount(i):
        return i % 97 + 1

    async def publish(self, valid, malformed, missing):
        nc = await nats.connect(servers=self.nats_url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = nc.jetstream(timeout=10)
        kinds = {i: "valid" for i in valid}
        kinds.update({i: "malformed" for i in malformed})
        kinds.update({i: "missing" for i in missing})
        order = sorted(kinds)
        interval = 1.0 / self.args.rate
        start = now()
        published = 0
        buckets = []

        async def send(subject, payload, headers):
            for attempt in range(100):
                try:
                    await js.publish(subject, payload, headers=headers)
                    return
                except Exception:
                    await asyncio.sleep(0.2)
            raise RuntimeError("publish kept failing")

        for k, i in enumerate(order):
            kind = kinds[i]
            if kind == "malformed":
                payload, headers = b'{"account_id": "' + str(i).encode() + b'", "amount": ', {"Nats-Msg-Id": f"soak-{i}"}
            else:
                body = json.dumps({"account_id": self.account(i), "amount": self.amount(i)}).encode()
                headers = {"Nats-Msg-Id": f"soak-{i}"} if kind == "valid" else {"x-soak": str(i)}
                payload = body
            await send("credits.requested", payload, headers)
            published += 1
            target = start + (k + 1) * interval
            delay = target - now()
            if delay > 0:
                await asyncio.sleep(delay)
        self.log("published", f"{published} messages")
        # 20% of the valid ones again, after the broker's duplicate window passed.
        await asyncio.sleep(self.args.window_ms / 1000 + 1)
        again = self.rng.sample(valid, len(valid) // 5)
        for i in again:
            body = json.dumps({"account_id": self.account(i), "amount": self.amount(i)}).encode()
            await send("credits.requested", body, {"Nats-Msg-Id": f"soak-{i}"})
        self.log("republished", f"{len(again)} valid messages with the same ids after the duplicate window")
        await nc.close()
        return len(again)

    # ---- checks ----------------------------------------------------------
    def psql(self, sql):
        host_port = self.args.pg_url.split("@")[-1]
        host, port = host_port.split(":")
        out = subprocess.run(["psql", "-h", host, "-p", port, "-U", "postgres", "-d", self.db, "-At", "-F", "\t", "-c", sql],
                             check=True, capture_output=True, text=True).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    async def consumer_state(self):
        """Messages pending or unacknowledged, summed over both consumers."""
        nc = await nats.connect(servers=self.nats_url.split(","))
        js = nc.jetstream()
        pending = ack_pending = 0
        for name in ("credit", "notify"):
            info = await js.consumer_info("CREDITS", name)
            pending += info.num_pending
            ack_pending += info.num_ack_pending
        await nc.close()
        return pending, ack_pending

    async def wait_drained(self, expected_credits, timeout):
        """Waits until every valid message is credited, the outbox is empty and
        the consumer has nothing pending; on timeout the checker still runs
        and reports what is missing."""
        deadline = now() + timeout
        last_report = 0.0
        while now() < deadline:
            try:
                credits = int(self.psql("SELECT count(*) FROM credit")[0][0])
                pending = int(self.psql("SELECT count(*) FROM outbox_message WHERE published_at IS NULL AND dead_at IS NULL")[0][0])
                num_pending, ack_pending = await self.consumer_state()
                if credits >= expected_credits and pending == 0 and num_pending == 0 and ack_pending == 0:
                    return True
                if now() - last_report > 10:
                    last_report = now()
                    self.log("waiting", f"credits {credits}/{expected_credits}, outbox pending {pending}, "
                                        f"stream pending {num_pending}, ack pending {ack_pending}")
            except Exception as e:
                print("waiting:", e, flush=True)
            await asyncio.sleep(1)
        self.log("timeout", "the system did not drain in time; checking anyway")
        return False

    async def applied_events(self):
        nc = await nats.connect(servers=self.nats_url.split(","))
        js = nc.jetstream()
        info = await js.stream_info("CREDITS")
        counts = {}
        sub = await js.subscribe("credits.applied", ordered_consumer=True)
        total = 0
        try:
            while True:
                msg = await sub.next_msg(timeout=5)
                total += 1
                mid = (msg.headers or {}).get("Nats-Msg-Id", "")
                counts[mid] = counts.get(mid, 0) + 1
        except Exception:
            pass
        await nc.close()
        return total, counts, info.config.num_replicas

    async def check(self, valid, malformed, missing):
        failures = []

        def expect(ok, what):
            print(("  ok   " if ok else "  FAIL ") + what, flush=True)
            if not ok:
                failures.append(what)

        credits = {row[0]: (row[1], int(row[2])) for row in self.psql("SELECT message_id, account_id, amount FROM credit")}
        valid_ids = {f"soak-{i}" for i in valid}
        expect(len(credits) == len(valid_ids) and set(credits) == valid_ids,
               f"credits == distinct valid message ids ({len(credits)} credits, {len(valid_ids)} valid ids)")
        dup_credits = self.psql("SELECT message_id FROM credit GROUP BY message_id HAVING count(*) > 1")
        expect(not dup_credits, f"no message credited twice ({len(dup_credits)} were)")
        expected_balance = {}
        for i in valid:
            expected_balance[self.account(i)] = expected_balance.get(self.account(i), 0) + self.amount(i)
        balances = {row[0]: int(row[1]) for row in self.psql("SELECT account_id, balance FROM account")}
        expect(balances == expected_balance, f"each account's balance == the sum of its distinct credits ({len(balances)} accounts)")
        markers = self.psql("SELECT count(*), count(DISTINCT message_id) FROM inbox_message WHERE consumer = 'credit'")[0]
        expect(int(markers[0]) == len(valid_ids) == int(markers[1]), f"each valid id has one inbox marker ({markers[0]} markers)")
        dead = self.psql("SELECT coalesce(message_id, ''), error FROM dead_letter")
        dead_ids = {row[0] for row in dead if row[0]}
        malformed_ids = {f"soak-{i}" for i in malformed}
        expect(malformed_ids <= dead_ids, f"every malformed message is dead-lettered ({len(malformed_ids & dead_ids)}/{len(malformed_ids)})")
        no_id = sum(1 for row in dead if not row[0])
        expect(no_id >= len(missing), f"every id-less message is dead-lettered ({no_id} rows for {len(missing)} messages)")
        expect(dead_ids <= malformed_ids, f"nothing else is dead-lettered ({len(dead_ids - malformed_ids)} others)")
        letters_by = dict(self.psql("SELECT consumer, count(*) FROM dead_letter GROUP BY consumer"))
        expect(set(letters_by) <= {"credit"}, f"only the credit consumer dead-letters (malformed input): {letters_by}")
        unpublished = int(self.psql("SELECT count(*) FROM outbox_message WHERE published_at IS NULL AND message_id NOT LIKE 'poison-%'")[0][0])
        outbox_rows = int(self.psql("SELECT count(*) FROM outbox_message WHERE message_id NOT LIKE 'poison-%'")[0][0])
        expect(unpublished == 0, f"every outbox row is published ({unpublished} are not)")
        poison = self.psql("SELECT count(*), count(*) FILTER (WHERE dead_at IS NOT NULL AND published_at IS NULL AND last_error IS NOT NULL) "
                           "FROM outbox_message WHERE message_id LIKE 'poison-%'")[0]
        expect(int(poison[0]) == self.poison_rows == int(poison[1]),
               f"every poison row ends dead with its error, unpublished ({poison[1]}/{self.poison_rows})")
        total, counts, replicas = await self.applied_events()
        repeated = sum(1 for n in counts.values() if n > 1)
        expect(replicas == 3, f"the stream is replicated R{replicas}")
        expect(total == outbox_rows and repeated == 0,
               f"credits.applied holds exactly one message per event ({total} messages, {outbox_rows} events, {repeated} repeated)")
        open_claims = int(self.psql("SELECT count(*) FROM inbox_message WHERE consumer = 'notify' AND processed_at IS NULL "
                                    "AND quarantined_at IS NULL AND (lease_until IS NULL OR lease_until < now())")[0][0])
        expect(open_claims == 0, f"no claim is left open without a live owner ({open_claims} are)")
        both = int(self.psql("SELECT count(*) FROM inbox_message WHERE processed_at IS NOT NULL AND quarantined_at IS NOT NULL")[0][0])
        expect(both == 0, f"no claim is both processed and quarantined ({both} are)")
        notified = int(self.psql("SELECT count(*) FROM inbox_message WHERE consumer = 'notify' AND processed_at IS NOT NULL")[0][0])
        missed = [k for k in (row[0] for row in self.psql("SELECT message_id FROM outbox_message WHERE published_at IS NOT NULL"))
                  if k not in self.webhook.keys]
        expect(notified == outbox_rows and not missed,
               f"every event's webhook call is recorded ({notified}/{outbox_rows}; {len(missed)} never reached the receiver)")
        if "commit" in self.args.faults.split(","):
            expect(self.commits_cut > 0, f"the proxy cut COMMITs ({self.commits_cut})")
        panics = [name for name, path in self.logs.items() if "panicked" in open(path, errors="replace").read()]
        expect(not panics, f"no process panicked ({panics})")
        planned = self.args.kills + len([f for f in self.FAULTS if f in self.args.faults.split(",")])
        expect(len(self.recoveries) >= planned, f"readyz answered after each fault ({len(self.recoveries)} recoveries)")
        return failures, {"credits": len(credits), "valid": len(valid_ids), "malformed": len(malformed), "missing_id": len(missing),
                          "dead_letters": len(dead), "outbox_rows": outbox_rows, "applied_events": total,
                          "poison_rows": self.poison_rows, "commits_cut": self.commits_cut, "webhook_calls": self.webhook.calls,
                          "notified": notified}

    def throughput(self):
        rows = self.psql("SELECT (extract(epoch FROM created_at)::bigint / 10) * 10 AS b, count(*) FROM credit GROUP BY b ORDER BY b")
        if not rows:
            return []
        first = int(rows[0][0])
        return [(int(b) - first, int(n) / 10) for b, n in rows]

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                code = p.wait(timeout=30)
                if code != 0:
                    self.log("exit", f"{name} exited with {code}")
            except subprocess.TimeoutExpired:
                p.kill()
        for p in self.nats_nodes.values():
            p.terminate()
            p.wait()
        self.webhook.stop()

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
        subprocess.run([a.seawall, "migrate"], env=self.env(), check=True, stdout=subprocess.DEVNULL)
        # The first consumer provisions the R3 stream and the durable consumer.
        self.spawn("consume1", "consume")
        self.spawn("api1", "api")
        deadline = now() + 60
        while not self.readyz() or not await self.stream_exists():
            if now() > deadline:
                raise RuntimeError("seawall did not come up")
            await asyncio.sleep(0.2)
        for name, cmd in [("consume2", "consume"), ("consume3", "consume"), ("consume4", "consume"), ("relay1", "relay"), ("relay2", "relay")]:
            self.spawn(name, cmd)
        self.log("seawall", "4 consume, 2 relay, 1 api running")
        valid, malformed, missing = self.plan_messages()
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
        with open(a.report, "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps({"counts": counts, "recoveries": self.recoveries}, indent=2))
        if failures:
            print(f"SOAK FAILED: {len(failures)} invariant(s) broken; logs in {self.dir}")
            return 1
        print(f"SOAK PASSED; report in {a.report}")
        shutil.rmtree(self.dir, ignore_errors=True)
        return 0

    async def stream_exists(self):
        try:
            nc = await nats.connect(servers=self.nats_url.split(","), connect_timeout=2)
            js = nc.jetstream()
            await js.consumer_info("CREDITS", "credit")
            await nc.close()
            return True
        except Exception:
            return False


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seawall", required=True)
    p.add_argument("--nats-server", required=True)
    p.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:55432")
    p.add_argument("--pg-data", required=True, help="data directory of that cluster, for the restart fault")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=500.0, help="messages per second published")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--faults", default=",".join(Soak.FAULTS),
                   help="which of " + ",".join(Soak.FAULTS) + " to inject (kills: --kills)")
    p.add_argument("--max-deliver", type=int, default=5, help="SEAWALL_MAX_DELIVER: the app's give-up point")
    p.add_argument("--outage", type=float, default=3.0, help="seconds a NATS node stays down")
    p.add_argument("--window-ms", type=int, default=20_000, help="JetStream duplicate window")
    p.add_argument("--ack-wait-ms", type=int, default=3_000)
    p.add_argument("--drain-timeout", type=float, default=180)
    p.add_argument("--port-base", type=int, default=54300)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--report", default="soak-report.json")
    return p.parse_args()


if __name__ == "__main__":
    soak = Soak(parse())
    try:
        code = asyncio.run(soak.main())
    except Exception as e:
        soak.log("error", repr(e))
        soak.stop_all()
        print(f"SOAK FAILED: {e}; logs in {soak.dir}")
        code = 1
    sys.exit(code)
