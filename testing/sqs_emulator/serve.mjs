// fauxqs (an SQS emulator, pinned in package.json) for brokers/sqs's live tests: on 127.0.0.1
// only (fauxqs's own CLI binds every interface), on the port given or one the system picks.
//
//   node serve.mjs --port-file PATH [--port N]
//
// Once listening it writes the port to PATH (through a rename, so a reader polling for the file
// never sees half of it) and serves until SIGTERM or SIGINT. It prints nothing but errors, and no
// request or credential ever: fauxqs's request log is off.
//
// Queue URLs: fauxqs names queues http://sqs.REGION.localhost:PORT/ACCOUNT/NAME by default and
// finds them only by that exact URL. With its store's host emptied it takes the URL from the
// creating request's Host header instead, http://127.0.0.1:PORT/000000000000/NAME, the URL the
// tests give as sqs+http://127.0.0.1:PORT/000000000000/NAME. The store class is not exported by
// the package, so it is imported by path (fauxqs is pinned: the path is that version's).

import { renameSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { buildApp } from "fauxqs";

const here = dirname(fileURLToPath(import.meta.url));
const { SqsStore } = await import(pathToFileURL(join(here, "node_modules/fauxqs/dist/sqs/sqsStore.js")).href);

function usage(message) {
  process.stderr.write(`serve.mjs: ${message}\nusage: node serve.mjs --port-file PATH [--port N]\n`);
  process.exit(2);
}

let portFile = "";
let port = 0;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--port-file" && i + 1 < args.length) {
    portFile = args[++i];
  } else if (args[i] === "--port" && i + 1 < args.length) {
    port = Number(args[++i]);
    if (!Number.isInteger(port) || port < 0 || port > 65535) usage(`bad port ${args[i]}`);
  } else {
    usage(`unknown argument ${args[i]}`);
  }
}
if (!portFile) usage("--port-file is required");

const sqsStore = new SqsStore();
sqsStore.host = "";
const app = buildApp({ logger: false, stores: { sqsStore } });

let closing = false;
async function close() {
  if (closing) return;
  closing = true;
  try {
    await app.close();
  } finally {
    process.exit(0);
  }
}
process.on("SIGTERM", close);
process.on("SIGINT", close);

try {
  await app.listen({ host: "127.0.0.1", port });
} catch (e) {
  process.stderr.write(`serve.mjs: cannot listen on 127.0.0.1:${port}: ${e.message}\n`);
  process.exit(1);
}
const tmp = `${portFile}.tmp`;
writeFileSync(tmp, `${app.server.address().port}\n`);
renameSync(tmp, portFile);
