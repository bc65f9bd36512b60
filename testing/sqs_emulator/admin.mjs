// Queue administration with the AWS SDK for JavaScript (pinned in package.json), for the
// end-to-end tests when they run against a real SQS endpoint (tests/common/brokers.py,
// PrivateSqs with IDEM_TEST_SQS_ENDPOINT) rather than the emulator:
//
//   node admin.mjs ENDPOINT create-queue NAME     prints the queue's URL
//   node admin.mjs ENDPOINT depth QUEUE_URL       prints the messages in it, visible, held or delayed
//   node admin.mjs ENDPOINT delete-queue QUEUE_URL
//
// The region is AWS_REGION (default us-east-1); the credentials are the SDK's usual ones from the
// environment. Errors go to stderr with exit 1; no credential is ever printed.

import { CreateQueueCommand, DeleteQueueCommand, GetQueueAttributesCommand, SQSClient } from "@aws-sdk/client-sqs";

const [endpoint, command, argument] = process.argv.slice(2);
if (!endpoint || !command || !argument || process.argv.length !== 5) {
  process.stderr.write("usage: node admin.mjs ENDPOINT create-queue NAME | depth QUEUE_URL | delete-queue QUEUE_URL\n");
  process.exit(2);
}
const client = new SQSClient({ endpoint, region: process.env.AWS_REGION || "us-east-1" });

try {
  if (command === "create-queue") {
    const attributes = argument.endsWith(".fifo") ? { FifoQueue: "true" } : {};
    const out = await client.send(new CreateQueueCommand({ QueueName: argument, Attributes: attributes }));
    process.stdout.write(`${out.QueueUrl}\n`);
  } else if (command === "depth") {
    const names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"];
    const out = await client.send(new GetQueueAttributesCommand({ QueueUrl: argument, AttributeNames: names }));
    const depth = names.reduce((sum, n) => sum + Number(out.Attributes?.[n] ?? 0), 0);
    process.stdout.write(`${depth}\n`);
  } else if (command === "delete-queue") {
    await client.send(new DeleteQueueCommand({ QueueUrl: argument }));
  } else {
    process.stderr.write(`admin.mjs: unknown command ${command}\n`);
    process.exit(2);
  }
} catch (e) {
  process.stderr.write(`admin.mjs: ${command}: ${e.name}: ${e.message}\n`);
  process.exit(1);
}
