"""The soak's load: which messages are valid, malformed or id-less (from the
seed), and an independent nats-py publisher of `ledger.record` requests
({"account_id": ..., "amount": ...}; the ledger's EntryRequest::parse rejects
the malformed ones, truncated JSON, and accepts the valid ones: a non-empty
account id, a positive amount)."""
import asyncio
import json

import nats

from soaklib.common import NATS_ERRORS, RECORD_SUBJECT, now


class Load:
    """Mixed into the soak and the standalone checker."""

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

        async def send(subject, payload, headers):
            for attempt in range(100):
                try:
                    await js.publish(subject, payload, headers=headers)
                    return
                except NATS_ERRORS:
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
            await send(RECORD_SUBJECT, payload, headers)
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
            await send(RECORD_SUBJECT, body, {"Nats-Msg-Id": f"soak-{i}"})
        self.log("republished", f"{len(again)} valid messages with the same ids after the duplicate window")
        await nc.close()
        return len(again)

