// Takes a session-bound hold on a lock and answers commands on stdin, one a line: `held`
// prints whether it is still held, `await-loss` waits until it is not (and says why),
// `release` releases it and exits. End of input exits without releasing (the process's end
// lets go). A refused acquire prints `error CODE` and exits 3.
//
// Usage: node dist/examples/contend.js LOCK WAIT_SECONDS  (the sidecar at $LEASEHOLD_URL)
import { createInterface } from "node:readline";

import { type Hold, SidecarError, acquire } from "../src/index.js";

const [lock, wait] = process.argv.slice(2);
let hold: Hold;
try {
  hold = await acquire(lock, { waitSeconds: Number(wait) });
} catch (error) {
  if (error instanceof SidecarError) {
    console.log(`error ${error.code}`);
    process.exit(3);
  }
  throw error;
}
console.log(`granted ${hold.token} ${hold.held()}`);
for await (const command of createInterface({ input: process.stdin })) {
  if (command === "held") {
    console.log(`held ${hold.held()}`);
  } else if (command === "await-loss") {
    const reason = await hold.lost;
    console.log(`lost ${hold.held()} ${reason}`);
  } else if (command === "release") {
    await hold.release();
    console.log(`released ${hold.held()}`);
    process.exit(0);
  } else {
    console.error(`unknown command ${JSON.stringify(command)}`);
    process.exit(2);
  }
}
process.exit(0);
