/**
 * The gateway's gRPC listener: Envoy's ext_proc service (the adapter in extproc-server.ts) and
 * the gRPC health protocol on one port, plaintext or TLS (mutual with a client CA), with the
 * HTTP/2 reset guard Envoy's stream-per-request pattern needs.
 */
import { readFileSync } from "node:fs";
import * as grpc from "@grpc/grpc-js";
import { HealthImplementation } from "grpc-health-check";
import { EXT_PROC_SERVER_OPTIONS, EXT_PROC_SERVICE_NAME, loadExtProc } from "../extproc/protos.js";
import { type ExtProcConnectionStats, guardResetBudget } from "../extproc/reset-budget.js";
import type { Logger } from "../shared/log.js";
import type { GatewayConfig } from "./config.js";

/** The health services that follow readiness (liveness is SERVING from the start). */
const READY_SERVICES = ["readiness", "", EXT_PROC_SERVICE_NAME];

/** Server credentials from PEM files; a missing or unreadable file is an error naming it. */
export function tlsCredentials(t: GatewayConfig["tls"]): grpc.ServerCredentials {
  if (!t) return grpc.ServerCredentials.createInsecure();
  const read = (what: string, file: string) => {
    try {
      return readFileSync(file);
    } catch (err) {
      throw new Error(`cannot read the ext_proc TLS ${what} ${file}: ${(err as Error).message}`);
    }
  };
  const cert = read("certificate", t.certFile);
  const key = read("key", t.keyFile);
  const ca = t.clientCaFile ? read("client CA", t.clientCaFile) : null;
  return grpc.ServerCredentials.createSsl(ca, [{ cert_chain: cert, private_key: key }], ca !== null);
}

export class ExtProcListener {
  private readonly server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
  private readonly health = new HealthImplementation({ liveness: "SERVING", readiness: "NOT_SERVING", "": "NOT_SERVING", [EXT_PROC_SERVICE_NAME]: "NOT_SERVING" });
  /** Envoy's HTTP/2 connections (undefined if the reset guard could not be installed). */
  connections: ExtProcConnectionStats | undefined;
  port = 0;

  constructor(private readonly log: Logger) {}

  setReady(ready: boolean): void {
    for (const s of READY_SERVICES) this.health.setStatus(s, ready ? "SERVING" : "NOT_SERVING");
  }

  /** Serves `handler` as ext_proc's Process method on host:port; resolves with the bound port. */
  async listen(handler: grpc.UntypedServiceImplementation[string], host: string, port: number, credentials: grpc.ServerCredentials): Promise<number> {
    this.server.addService(loadExtProc().service, { Process: handler });
    this.health.addToServer(this.server);
    this.port = await new Promise<number>((resolve, reject) => this.server.bindAsync(`${host}:${port}`, credentials, (err, p) => (err ? reject(err) : resolve(p))));
    // Envoy resets every ext_proc stream; Node would drop the connection after ~1000 resets.
    this.connections = guardResetBudget(this.server, { onRotate: (streams, resets) => this.log.debug({ streams, resets }, "ext_proc connection rotated before the HTTP/2 reset limit") });
    if (!this.connections) this.log.warn("cannot reach grpc-js' HTTP/2 servers: ext_proc connections are not rotated before Node's rapid-reset limit");
    return this.port;
  }

  /** Stops taking streams; those in flight get `graceMs` to finish, then are cancelled. */
  /** `beforeForce`: runs when the grace period is over, before the streams still open are cut (answers written then still go out). */
  async close(graceMs: number, beforeForce?: () => void): Promise<void> {
    this.setReady(false);
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        beforeForce?.();
        // One turn of the event loop for the answers just written to reach the wire.
        setImmediate(() => {
          this.server.forceShutdown();
          resolve();
        });
      }, graceMs);
      this.server.tryShutdown(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }
}
