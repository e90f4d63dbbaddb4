/**
 * connectNats against a real nats-server without JetStream: it fails, and leaves no connection
 * behind (one left reconnecting forever kept a benchmark's process alive after its last line).
 */
import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitFor } from "../../test/harness/wait.js";
import { connectNats } from "./nats.js";
import { freePort, natsServerBinary } from "./nats-server.js";

let server: ReturnType<typeof spawn>;
let port: number;
let monitor: number;

beforeAll(async () => {
  port = await freePort();
  monitor = await freePort();
  server = spawn(natsServerBinary(), ["-a", "127.0.0.1", "-p", String(port), "-m", String(monitor)], { stdio: "ignore" });
  await waitFor(() => fetch(`http://127.0.0.1:${monitor}/varz`).then((r) => r.ok, () => false), 10_000, "nats-server to listen", 50);
});
afterAll(() => {
  server?.kill("SIGKILL");
});

const connections = async () => ((await (await fetch(`http://127.0.0.1:${monitor}/connz`)).json()) as { num_connections: number }).num_connections;

describe("connectNats - a server without JetStream", () => {
  it("rejects, and closes the connection it opened", async () => {
    await expect(connectNats(`nats://127.0.0.1:${port}`, "no-jetstream")).rejects.toThrow();
    let n = -1;
    // A connection left behind stays connected to this live server: the count never reaches 0.
    await waitFor(async () => (n = await connections()) === 0, 10_000, () => `no client connection left (${n})`, 50);
  });
});
