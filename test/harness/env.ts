/**
 * A per-test-file environment: a real nats-server with jetroute's streams applied, a connection,
 * helpers to publish pods, and in-process gateways that are stopped with the environment.
 */
import { Subjects } from "../../streams/subjects.js";
import { applyStreams } from "../../streams/apply.js";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../../services/gateway/gateway.js";
import { createLogger } from "../../services/shared/log.js";
import { connectNats, type NatsHandles } from "../../services/shared/nats.js";
import { acked } from "../../services/shared/publish.js";
import type { PodEvent } from "../../schemas/events.js";
import { type NatsServerHandle, startNatsServer } from "../../services/shared/nats-server.js";

export { waitFor } from "./wait.js";

export const quietLog = createLogger("test", process.env.JETROUTE_TEST_LOG ?? "silent");

export interface TestEnv {
  server: NatsServerHandle;
  nats: NatsHandles;
  subjects: Subjects;
  publishPod(p: Partial<PodEvent> & { pod: string; address: string }): Promise<void>;
  gateway(opts?: Partial<GatewayOptions>): Promise<GatewayHandle>;
  stop(): Promise<void>;
}

export const MODEL = "org/Llama-3.1-8B";

export async function startTestEnv(): Promise<TestEnv> {
  const server = await startNatsServer();
  const nats = await connectNats(server.url);
  await applyStreams(nats.nc, nats.jsm);
  const subjects = new Subjects();
  const gateways: GatewayHandle[] = [];
  return {
    server,
    nats,
    subjects,
    async publishPod(p) {
      const ev: PodEvent = { type: "pod", action: "upsert", model: MODEL, ready: true, engine: "vllm", ts: Date.now(), ...p };
      await acked(nats.js, subjects.pod(ev.model, ev.pod), ev);
    },
    async gateway(opts = {}) {
      const gw = await startGateway({ nats: server.url, port: 0, host: "127.0.0.1", adminPort: -1, log: quietLog, heartbeatIntervalMs: 200, shutdownGraceMs: 300, ...opts });
      gateways.push(gw);
      await gw.whenReady();
      return gw;
    },
    async stop() {
      await Promise.all(gateways.map((g) => g.close()));
      await nats.nc.close();
      await server.stop();
    },
  };
}

/**
 * A clock for gateways that starts at the beginning of a rate-limit minute (shifted back by how
 * far into the minute it is now), so a test of per-minute limits never straddles a window reset.
 * Give the same clock to every replica of the test. `nextMinute()` moves it forward to the next
 * minute's start (for a per-minute test that runs late in a long describe block; never backwards).
 */
export function minuteStartClock(): (() => number) & { nextMinute(): void } {
  let shift = Date.now() % 60_000;
  const clock = () => Date.now() - shift;
  return Object.assign(clock, {
    nextMinute() {
      shift -= 60_000 - (clock() % 60_000);
    },
  });
}
