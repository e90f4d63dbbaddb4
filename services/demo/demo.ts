/**
 * `jetroute demo`: the whole system on one machine. A nats-server (or NATS_URL), the streams,
 * a simulated engine fleet, the pod-watcher and metrics-scraper, two gateway replicas and the
 * dev front on :8080 — each a separate process, as in production. Ctrl-C stops them in order.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import { stringify as toYaml } from "yaml";
import { Kvm } from "@nats-io/kv";
import { MODEL_CONFIG_KEY_PREFIX } from "../../schemas/config.js";
import { applyStreams } from "../../streams/apply.js";
import { configBucketName } from "../../streams/definitions.js";
import { encodeToken } from "../../streams/tokens.js";
import type { Logger } from "../shared/log.js";
import { connectNats } from "../shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../shared/nats-server.js";
import { type ServiceProcess, spawnJetroute } from "../shared/processes.js";

export interface DemoOptions {
  port: number;
  pods: number;
  model: string;
  timeScale: number;
  stateDir: string;
  gatewayBasePort: number;
  simBasePort: number;
  /** The Batch API's port (`jetroute batch-api`); the front forwards /v1/files and /v1/batches to it. */
  batchApiPort: number;
  /** Batch workers (`jetroute batch-worker`), each sending items through the front. */
  batchWorkers: number;
  log: Logger;
}

/**
 * The demo model's flow control, stored unless the model already has a config: batch items (the
 * workers' `batch` objective) wait in a sheddable band below every interactive request.
 */
export const DEMO_FLOW_CONTROL = { flowControl: { objectives: { interactive: { priority: 10 }, batch: { priority: -1 } }, defaultObjective: "interactive" } };

export interface DemoHandle {
  natsUrl: string;
  frontUrl: string;
  stop(): Promise<void>;
}

async function portFree(port: number): Promise<boolean> {
  return await new Promise((resolve) => {
    const srv = net.createServer();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
}

async function waitHttp(url: string, timeoutMs: number, ok: (status: number) => boolean = (s) => s < 500): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1_000) });
      await res.arrayBuffer();
      if (ok(res.status)) return;
    } catch {
      /* not up yet */
    }
    if (Date.now() > deadline) throw new Error(`${url} did not become ready within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function startDemo(o: DemoOptions): Promise<DemoHandle> {
  const log = o.log;
  const gwPorts = [o.gatewayBasePort, o.gatewayBasePort + 10];
  const adminPorts = [o.gatewayBasePort + 88, o.gatewayBasePort + 89];
  const needed = [o.port, o.batchApiPort, ...gwPorts, ...adminPorts, ...Array.from({ length: o.pods }, (_, i) => o.simBasePort + i)];
  for (const p of needed) {
    if (!(await portFree(p))) throw new Error(`port ${p} is in use; stop what uses it or pick other ports (--port, --gateway-port, --sim-port)`);
  }
  const logDir = path.join(o.stateDir, "logs");
  mkdirSync(logDir, { recursive: true });
  const children: ServiceProcess[] = [];
  let nats: NatsServerHandle | undefined;
  const stop = async () => {
    for (const c of children.reverse()) await c.stop();
    await nats?.stop();
  };
  try {
    let natsUrl = process.env.NATS_URL;
    if (!natsUrl) {
      nats = await startNatsServer({ port: (await portFree(4222)) ? 4222 : undefined });
      natsUrl = nats.url;
    }
    log.info({ natsUrl }, "NATS ready");
    const h = await connectNats(natsUrl, "jetroute-demo");
    for (const c of await applyStreams(h.nc, h.jsm)) log.info({ stream: c.name, action: c.action }, "stream");
    const kv = await new Kvm(h.nc).open(configBucketName("jr"));
    await kv.create(`${MODEL_CONFIG_KEY_PREFIX}${encodeToken(o.model)}`, JSON.stringify(DEMO_FLOW_CONTROL)).then(
      () => log.info({ model: o.model }, "flow control on: batch items run below interactive requests"),
      () => log.info({ model: o.model }, "the model has a config already; left as it is"),
    );
    await h.nc.close();

    const spawn = (name: string, args: string[]) => {
      const c = spawnJetroute(name, args, { logFile: path.join(logDir, `${name}.log`), env: { JETROUTE_LOG_LEVEL: "info" } });
      children.push(c);
      return c;
    };
    const sim = spawn("sim", ["sim", "--pods", String(o.pods), "--base-port", String(o.simBasePort), "--model", o.model, "--time-scale", String(o.timeScale)]);
    const pods = await Promise.all(
      Array.from({ length: o.pods }, (_, i) =>
        sim.waitForLine<{ pod: string; address: string; kvEvents?: { endpoint: string; replayEndpoint?: string; topic?: string } }>(
          (v) => v.pod !== undefined && v.address?.endsWith(`:${o.simBasePort + i}`),
        ),
      ),
    );
    const podFile = path.join(o.stateDir, "pods.yaml");
    writeFileSync(podFile, toYaml({ pods: pods.map((p) => ({ name: p.pod, model: o.model, address: p.address, engine: "vllm", ...(p.kvEvents ? { kvEvents: p.kvEvents } : {}) })) }));
    spawn("pod-watcher", ["pod-watcher", "--static", podFile, "--nats", natsUrl]);
    spawn("metrics-scraper", ["metrics-scraper", "--nats", natsUrl]);
    spawn("kv-bridge", ["kv-bridge", "--nats", natsUrl]);
    gwPorts.forEach((port, i) => {
      spawn(`gateway-${i + 1}`, ["gateway", "--nats", natsUrl as string, "--port", String(port), "--admin-port", String(adminPorts[i]), "--id", `demo-gw-${i + 1}`, "--host", "127.0.0.1", "--tokenizer", "local", "--expose-pod-addresses"]);
    });
    // Generous: on a busy host a gateway process takes tens of seconds to start.
    await Promise.all(adminPorts.map((p) => waitHttp(`http://127.0.0.1:${p}/readyz`, 120_000, (s) => s === 200)));
    const batchApi = spawn("batch-api", ["batch-api", "--nats", natsUrl, "--port", String(o.batchApiPort)]);
    await batchApi.waitForLine<{ service?: string }>((v) => v.service === "batch-api", 30_000);
    spawn("front", ["front", "--port", String(o.port), "--gateway", gwPorts.map((p) => `127.0.0.1:${p}`).join(","), "--batch-api", `127.0.0.1:${o.batchApiPort}`]);
    await waitHttp(`http://127.0.0.1:${o.port}/v1/models`, 30_000, (s) => s === 200);
    for (let i = 0; i < o.batchWorkers; i++) spawn(`batch-worker-${i + 1}`, ["batch-worker", "--nats", natsUrl, "--target", `http://127.0.0.1:${o.port}`, "--id", `demo-batch-worker-${i + 1}`]);
    return { natsUrl, frontUrl: `http://127.0.0.1:${o.port}`, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

export function demoBanner(d: DemoHandle, o: DemoOptions): string {
  return `
jetroute demo is up: ${o.pods} simulated vLLM pods, pod-watcher, metrics-scraper, kv-bridge, 2 gateway replicas, dev front,
batch-api and ${o.batchWorkers} batch workers.

  Try it:
    curl -sN ${d.frontUrl}/v1/chat/completions -H 'content-type: application/json' \\
      -d '{"model":"${o.model}","messages":[{"role":"user","content":"Hello!"}],"stream":true,"stream_options":{"include_usage":true}}'
    curl -s ${d.frontUrl}/v1/models
    # the Responses API and Anthropic's Messages API (docs/stateful-apis.md), also with the official clients
    curl -sN ${d.frontUrl}/v1/responses -H 'content-type: application/json' \
      -d '{"model":"${o.model}","instructions":"Be brief.","input":"Hello!","stream":true}'
    curl -s ${d.frontUrl}/v1/messages -H 'content-type: application/json' \
      -d '{"model":"${o.model}","max_tokens":16,"system":"Be brief.","messages":[{"role":"user","content":"Hello!"}]}'
    # the demo's gateways echo the pod they picked (target-pod, --expose-pod-addresses): curl -i shows it
    curl -sN ${d.frontUrl}/v1/chat/completions -H 'routing-strategy: prefix-cache' -H 'content-type: application/json' \\
      -d '{"model":"${o.model}","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hi"}]}'
    curl -s http://127.0.0.1:${o.gatewayBasePort + 88}/debug/explain -H 'routing-strategy: prefix-cache' \\
      -d '{"model":"${o.model}","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hi"}]}'
    curl -s http://127.0.0.1:${o.gatewayBasePort + 88}/metrics
    curl -s http://127.0.0.1:${o.gatewayBasePort + 88}/debug/state      # gateway 1's views

  The Batch API (docs/batch.md), e.g. with the openai client (baseURL ${d.frontUrl}/v1) or curl:
    printf '%s\n' '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"${o.model}","messages":[{"role":"user","content":"Hi"}]}}' > in.jsonl
    curl -s ${d.frontUrl}/v1/files -F purpose=batch -F file=@in.jsonl                       # -> file-...
    curl -s ${d.frontUrl}/v1/batches -H 'content-type: application/json' \
      -d '{"input_file_id":"file-...","endpoint":"/v1/chat/completions","completion_window":"24h"}'
    node bin/jetroute.js batch status --nats ${d.natsUrl} --all                           # progress lines

  Watch the event streams (nats CLI, payloads are JSON):
    nats --server ${d.natsUrl} stream ls
    nats --server ${d.natsUrl} sub 'jr.charges.>'
    nats --server ${d.natsUrl} stream view JR_DECISIONS
    nats --server ${d.natsUrl} stream view JR_PODS
    nats --server ${d.natsUrl} sub 'jr.kv.>'                # KV block events from the engines

  Logs: ${path.join(o.stateDir, "logs")}/
  Ctrl-C stops everything.
`;
}
