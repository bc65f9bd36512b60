// Verifies signed requests with the Standard Webhooks reference library (Webhook.verify), for
// tests/signing/test_signed_webhooks.py: what idem-relay and idem-consume send must pass it. One
// JSON request per stdin line, one JSON answer per stdout line; exits 1 if any request failed.
//
//   {"secret": "whsec_...", "headers": {"webhook-id": ..., ...}, "body_base64": "...", "now": 1700000000}
//     -> {"ok": true}  or  {"ok": false, "error": "No matching signature found"}
//
// "now" (Unix seconds, optional) fakes the library's clock for that one verification, so that a
// captured request can be checked as if it arrived later (a replay).
import readline from "node:readline";
import { Webhook } from "standardwebhooks";

function verify(req) {
  const wh = new Webhook(req.secret);
  const body = Buffer.from(req.body_base64, "base64");
  const realNow = Date.now;
  if (req.now !== undefined) Date.now = () => req.now * 1000;
  try {
    wh.verify(body, req.headers);
  } finally {
    Date.now = realNow;
  }
}

let failed = false;
const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let answer;
  try {
    verify(JSON.parse(line));
    answer = { ok: true };
  } catch (e) {
    failed = true;
    answer = { ok: false, error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
process.exitCode = failed ? 1 : 0;
