/**
 * The gRPC health protocol as Envoy (and Kubernetes gRPC probes) ask it: liveness always serving;
 * readiness, "" and the ext_proc service serving only while the gateway's views are caught up.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { protoPath } from "grpc-health-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXT_PROC_SERVICE_NAME } from "../services/extproc/protos.js";
import { startTestEnv, type TestEnv } from "./harness/env.js";

type HealthClient = grpc.Client & { check(req: { service: string }, cb: (err: grpc.ServiceError | null, res?: { status: string }) => void): void };

function healthClient(target: string): HealthClient {
  const def = protoLoader.loadSync(protoPath, { keepCase: true, enums: String });
  const pkg = grpc.loadPackageDefinition(def) as unknown as { grpc: { health: { v1: { Health: grpc.ServiceClientConstructor } } } };
  return new pkg.grpc.health.v1.Health(target, grpc.credentials.createInsecure()) as unknown as HealthClient;
}

const check = (c: HealthClient, service: string) =>
  new Promise<string>((resolve, reject) => c.check({ service }, (err, res) => (err ? reject(err) : resolve(res?.status ?? "?"))));

describe("gateway - gRPC health", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
  });
  afterAll(async () => env?.stop());

  it("serves liveness, readiness, '' and the ext_proc service once caught up, and stops serving on shutdown", async () => {
    const gw = await env.gateway({ id: "health-gw" });
    const c = healthClient(`127.0.0.1:${gw.port}`);
    for (const s of ["liveness", "readiness", "", EXT_PROC_SERVICE_NAME]) expect(await check(c, s)).toBe("SERVING");
    await expect(check(c, "no.such.Service")).rejects.toMatchObject({ code: grpc.status.NOT_FOUND });
    const closing = gw.close();
    // Health flips before the server stops accepting calls, so Envoy drains this replica first.
    const during = await check(c, "readiness").catch(() => "UNAVAILABLE");
    expect(["NOT_SERVING", "UNAVAILABLE"]).toContain(during);
    await closing;
    c.close();
  });
});
