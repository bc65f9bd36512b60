// Signs webhook events with the providers' own libraries, for tests/gateway/test_webhooks.py:
// one JSON request per stdin line, one JSON answer (the headers to send) per stdout line.
//
//   {"provider": "stripe", "secret": "whsec_...", "payload": "...", "timestamp": 1700000000}
//     -> {"Stripe-Signature": "t=1700000000,v1=..."}     (stripe.webhooks.generateTestHeaderString)
//   {"provider": "standard", "secret": "whsec_<base64>", "id": "msg_...", "payload": "...", "timestamp": ...}
//     -> {"webhook-id": ..., "webhook-timestamp": ..., "webhook-signature": "v1,..."}   (Webhook.sign)
//
// Each signature is checked with the same library's verifier before it is printed (with the
// timestamp the library would accept), so a test that sends it knows the library itself calls it
// genuine. A request that fails prints {"error": "..."}.
import readline from "node:readline";
import Stripe from "stripe";
import { Webhook } from "standardwebhooks";

const stripe = new Stripe("sk_test_idem_webhook_signers");

function sign(req) {
  if (req.provider === "stripe") {
    const header = stripe.webhooks.generateTestHeaderString({
      payload: req.payload,
      secret: req.secret,
      timestamp: req.timestamp,
    });
    // constructEvent checks against the current clock: verify only timestamps it would accept.
    if (Math.abs(Date.now() / 1000 - req.timestamp) < 300) {
      stripe.webhooks.constructEvent(req.payload, header, req.secret);
    }
    return { "Stripe-Signature": header };
  }
  if (req.provider === "standard") {
    const wh = new Webhook(req.secret);
    const signature = wh.sign(req.id, new Date(req.timestamp * 1000), req.payload);
    const headers = {
      "webhook-id": req.id,
      "webhook-timestamp": String(req.timestamp),
      "webhook-signature": signature,
    };
    if (Math.abs(Date.now() / 1000 - req.timestamp) < 300) wh.verify(req.payload, headers);
    return headers;
  }
  throw new Error("unknown provider " + req.provider);
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let answer;
  try {
    answer = sign(JSON.parse(line));
  } catch (e) {
    answer = { error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
