/**
 * Real nats-server processes for the demo, tests and benchmarks: JetStream on, free ports,
 * a temp store dir each, stopped (and the dir removed) by `stop()`.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

export interface NatsServerHandle {
  url: string;
  port: number;
  storeDir: string;
  proc: ChildProcess;
  stop(): Promise<void>;
  /** Stops with SIGKILL, keeping the store dir (crash tests restart on it). */
  kill(): Promise<void>;
}

export function natsServerBinary(): string {
  const explicit = process.env.NATS_SERVER_BIN;
  if (explicit) return explicit;
  for (const p of ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"]) {
    try {
      execFileSync(p, ["--version"], { stdio: "ignore" });
      return p;
    } catch {
      /* try the next */
    }
  }
  try {
    execFileSync("nats-server", ["--version"], { stdio: "ignore" });
    return "nats-server";
  } catch {
    throw new Error("nats-server not found: install it with `apt-get install -y nats-server` (Debian) or set NATS_SERVER_BIN");
  }
}

export async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
}

async function waitForPort(port: number, proc: ChildProcess, timeoutMs: number, log: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`nats-server exited with ${proc.exitCode}: ${log()}`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, "127.0.0.1");
      s.once("connect", () => {
        s.destroy();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`nats-server did not listen on ${port} within ${timeoutMs} ms: ${log()}`);
}

function stopProc(proc: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    proc.once("exit", () => resolve());
    proc.kill(signal);
  });
}

export interface StartOptions {
  port?: number;
  storeDir?: string;
  /** Extra config file text (cluster blocks etc.). */
  config?: string;
  serverName?: string;
}

export async function startNatsServer(opts: StartOptions = {}): Promise<NatsServerHandle> {
  const port = opts.port ?? (await freePort());
  const storeDir = opts.storeDir ?? mkdtempSync(path.join(os.tmpdir(), "jetroute-nats-"));
  const confPath = path.join(storeDir, "nats.conf");
  writeFileSync(
    confPath,
    [
      `port: ${port}`,
      `host: 127.0.0.1`,
      `server_name: ${opts.serverName ?? `jr-${port}`}`,
      `jetstream { store_dir: "${path.join(storeDir, "js")}" }`,
      `max_payload: 8MB`,
      opts.config ?? "",
    ].join("\n"),
  );
  const proc = spawn(natsServerBinary(), ["-c", confPath], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  await waitForPort(port, proc, 10_000, () => stderr);
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    proc,
    async stop() {
      await stopProc(proc, "SIGTERM");
      if (!opts.storeDir) rmSync(storeDir, { recursive: true, force: true });
    },
    async kill() {
      await stopProc(proc, "SIGKILL");
    },
  };
}

export interface NatsClusterHandle {
  servers: NatsServerHandle[];
  urls: string[];
  stop(): Promise<void>;
}

/** A 3-node JetStream cluster on loopback (for fault tests: kill a node, the streams stay up). */
export async function startNatsCluster(size = 3): Promise<NatsClusterHandle> {
  const clientPorts = await Promise.all(Array.from({ length: size }, () => freePort()));
  const clusterPorts = await Promise.all(Array.from({ length: size }, () => freePort()));
  const routes = clusterPorts.map((p) => `nats-route://127.0.0.1:${p}`).join(", ");
  const servers = await Promise.all(
    clientPorts.map((port, i) =>
      startNatsServer({
        port,
        serverName: `jr-node-${i}`,
        config: `cluster { name: jetroute-test, listen: 127.0.0.1:${clusterPorts[i]}, routes: [ ${routes} ] }`,
      }),
    ),
  );
  return {
    servers,
    urls: servers.map((s) => s.url),
    async stop() {
      await Promise.all(servers.map((s) => s.stop()));
    },
  };
}
