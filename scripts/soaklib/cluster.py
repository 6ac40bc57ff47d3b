"""The soak's servers and processes: a 3-node NATS JetStream cluster, the
seawall-testbed processes (the platform on the test kit's ledger domain), the
TCP proxy that cuts COMMITs, the webhook receiver."""
import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nats
from nats.js.api import StreamConfig

from soaklib.common import HOOK_CONSUMER, LEDGER_CONSUMER, NATS_ERRORS, STREAM, now


class Webhook:
    """The hook consumer's receiver: answers 200 and remembers each
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

        self.handler = Handler
        self.server = None

    def start(self):
        """Listens (again): a stopped receiver refuses connections."""
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None



class Cluster:
    """Mixed into the soak: starting, waiting for and stopping what runs."""

    # ---- NATS cluster -------------------------------------------------
    def ports_free(self):
        """Refuses to start over servers left by an earlier soak that was
        killed: its stream would mix old messages into this run's checks."""
        # (The webhook receiver is already listening on its own port.)
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
            except OSError:  # refused, or not healthy yet (URLError is one)
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
            except NATS_ERRORS as e:
                if now() > deadline:
                    raise RuntimeError(f"JetStream cluster not ready: {e}")
                await asyncio.sleep(0.5)

    # ---- seawall-testbed processes -------------------------------------
    def env(self, name=""):
        """The process's environment. Every SEAWALL_ variable set here is a
        platform setting (src/config.rs `Settings`) or, SEAWALL_LOG, one of
        its `NOT_SETTINGS`: the testbed refuses any other at start-up. The
        domain's knobs are TESTBED_ ones, and only the soak's own: none is
        inherited (a TESTBED_FAULT left in the caller's environment would
        abort every process)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESTBED_")}
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
            # The ledger's `hook` consumer, a two-phase claim per recorded entry.
            "TESTBED_WEBHOOK_URL": self.webhook.url,
            # An effect's claim must outlive its handling time, which must
            # outlive the slow-handler fault (ack wait + 1 s) and a SIGSTOP
            # (ack wait + 1.5 s) landing on a delivery slowed by a fault.
            "SEAWALL_CLAIM_LEASE_MS": str(5 * self.args.ack_wait_ms),
            "SEAWALL_MAX_HANDLING_MS": str(5 * self.args.ack_wait_ms),
            "SEAWALL_STREAM_MAX_AGE_MS": "86400000",
            "SEAWALL_RELAY_POLL_MS": "200",
            "SEAWALL_API_ADDR": f"127.0.0.1:{self.api_port}",
            # Relays and consumers serve their probes on ports of their own.
            "SEAWALL_METRICS_ADDR": "127.0.0.1:0",
            "SEAWALL_LOG": "info",
            "SEAWALL_OUTBOX_MODE": self.args.outbox_mode,
        })
        env.update(self.extra_env.get(name, {}))
        return env

    def spawn(self, name, command):
        path = os.path.join(self.dir, f"{name}.log")
        log = open(path, "ab")
        self.logs[name] = path
        self.procs[name] = subprocess.Popen([self.args.binary, command], env=self.env(name), stdout=log, stderr=log)

    def readyz(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:  # refused, timed out or 503 (HTTPError is one)
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

    async def wait_started(self, names, ready, timeout=60):
        """Waits until `ready()` (a plain or a coroutine function) returns
        true; fails at once, naming its log, when one of the processes
        `names` exits (the testbed refusing its settings, say) rather than at
        the timeout."""
        deadline = now() + timeout
        while True:
            ok = ready()
            if asyncio.iscoroutine(ok):
                ok = await ok
            if ok:
                return
            for name in names:
                code = self.procs[name].poll()
                if code is not None:
                    raise RuntimeError(f"{name} exited with {code} while starting; see {self.logs[name]}")
            if now() > deadline:
                raise RuntimeError(f"{', '.join(names)} did not come up within {timeout} s; logs in {self.dir}")
            await asyncio.sleep(0.2)

    def running(self, name):
        """The process is past its start-up (tables, migrations, NATS, the
        stream): the line the platform's `serve` prints then."""
        with open(self.logs[name], errors="replace") as f:
            return "seawall is running" in f.read()

    async def provisioned(self):
        """The ledger's tables exist (the testbed creates them at start-up)
        and so do the stream and both durable consumers."""
        try:
            tables = self.psql("SELECT to_regclass('ledger_entry') IS NOT NULL AND to_regclass('ledger_balance') IS NOT NULL")
        except subprocess.CalledProcessError:
            return False
        if tables != [["t"]]:
            return False
        try:
            nc = await nats.connect(servers=self.nats_url.split(","), connect_timeout=2)
        except NATS_ERRORS:
            return False
        try:
            js = nc.jetstream()
            for consumer in (LEDGER_CONSUMER, HOOK_CONSUMER):
                await js.consumer_info(STREAM, consumer)
            return True
        except NATS_ERRORS:
            return False
        finally:
            await nc.close()


