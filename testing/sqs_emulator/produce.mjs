// A real AWS client producing to a queue, for brokers/sqs's live tests: the AWS SDK for
// JavaScript's SQSClient (pinned in package.json), one SendMessage per line of standard input.
//
//   node produce.mjs QUEUE_URL < messages.jsonl
//
// Each line is a JSON object: {"body": "...", "id": "...", "content_type": "...", "group": "...",
// "dedup": "...", "attributes": {"name": "value"}}, all but body optional. `id` becomes the String
// attribute message_id, `content_type` the attribute content_type, `attributes` more String
// attributes; on a FIFO queue `group` is the MessageGroupId and `dedup` (else `id`) the
// MessageDeduplicationId. The endpoint is the queue URL's origin; the region is AWS_REGION
// (default us-east-1); the credentials are the SDK's usual ones from the environment. It prints
// "sent N" and exits 0, or the SDK's error and exits 1; never a credential.

import { createInterface } from "node:readline";
import { SendMessageCommand, SQSClient } from "@aws-sdk/client-sqs";

const queueUrl = process.argv[2];
if (!queueUrl || process.argv.length !== 3) {
  process.stderr.write("usage: node produce.mjs QUEUE_URL < messages.jsonl\n");
  process.exit(2);
}
const client = new SQSClient({
  endpoint: new URL(queueUrl).origin,
  region: process.env.AWS_REGION || "us-east-1",
  maxAttempts: 1,
});

let sent = 0;
try {
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (line.trim() === "") continue;
    const m = JSON.parse(line);
    const attributes = {};
    if (m.id !== undefined) attributes.message_id = { DataType: "String", StringValue: m.id };
    if (m.content_type !== undefined) attributes.content_type = { DataType: "String", StringValue: m.content_type };
    for (const [name, value] of Object.entries(m.attributes ?? {})) {
      attributes[name] = { DataType: "String", StringValue: value };
    }
    const input = { QueueUrl: queueUrl, MessageBody: m.body };
    if (Object.keys(attributes).length > 0) input.MessageAttributes = attributes;
    if (m.group !== undefined) input.MessageGroupId = m.group;
    if (m.dedup !== undefined || (m.group !== undefined && m.id !== undefined)) input.MessageDeduplicationId = m.dedup ?? m.id;
    await client.send(new SendMessageCommand(input));
    ++sent;
  }
} catch (e) {
  process.stderr.write(`produce.mjs: after ${sent} sent: ${e.name}: ${e.message}\n`);
  process.exit(1);
}
process.stdout.write(`sent ${sent}\n`);
