/**
 * The admin HTTP port on a real server (port 0, loopback): with `authorize`, `/debug/*` needs an
 * admin API key (401 without or with a bad or revoked key, 403 for a valid client key) while
 * `/healthz`, `/readyz` and `/metrics` stay open for probes and Prometheus; without it, as
 * under `--auth off`, everything is open.
 */
import { afterEach, describe, expect, it } from "vitest";
import type { ApiKeyRecord } from "../../schemas/config.js";
import { createLogger } from "../shared/log.js";
import { type AdminServer, type AdminServerOptions, adminAuthorizer, startAdminServer } from "./admin-server.js";
import { ApiKeyView, generateApiKey, hashApiKey } from "./auth.js";

const log = createLogger("test", "silent");
const servers: AdminServer[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.close();
});

let explained = 0;
async function start(extra: Partial<AdminServerOptions> = {}): Promise<string> {
  const s = await startAdminServer({
    port: 0,
    host: "127.0.0.1",
    log,
    ready: () => true,
    state: () => ({ pods: ["secret-pod"] }),
    metrics: { render: async () => "jetroute_up 1\n", contentType: "text/plain; version=0.0.4" },
    explain: async () => {
      explained++;
      return { status: 200, body: { pick: "p1" } };
    },
    ...extra,
  });
  servers.push(s);
  return `http://127.0.0.1:${s.port}`;
}

const rec = (over: Partial<ApiKeyRecord> = {}): ApiKeyRecord => ({ user: "ops", createdAt: 1_700_000_000_000, ...over });

function keys(): { view: ApiKeyView; admin: string; client: string; revokedAdmin: string } {
  const view = new ApiKeyView();
  const admin = generateApiKey();
  const client = generateApiKey();
  const revokedAdmin = generateApiKey();
  view.set(hashApiKey(admin), rec({ admin: true }));
  view.set(hashApiKey(client), rec({ user: "alice" }));
  view.set(hashApiKey(revokedAdmin), rec({ admin: true, disabled: true, revokedAt: 1_700_000_000_001 }));
  return { view, admin, client, revokedAdmin };
}

const bearer = (k: string) => ({ authorization: `Bearer ${k}` });
const explainBody = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });

describe("admin server with authorize (gateway --auth required)", () => {
  it("keeps /healthz, /readyz and /metrics open without a key", async () => {
    const url = await start({ authorize: adminAuthorizer(keys().view) });
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect(await (await fetch(`${url}/readyz`)).json()).toEqual({ ready: true });
    const m = await fetch(`${url}/metrics`);
    expect(m.status).toBe(200);
    expect(await m.text()).toBe("jetroute_up 1\n");
  });

  it("refuses /debug/state and /debug/explain with 401 without a key, a malformed header, an unknown or a revoked key", async () => {
    const k = keys();
    const url = await start({ authorize: adminAuthorizer(k.view) });
    const cases: Array<[Record<string, string>, RegExp]> = [
      [{}, /No API key provided/],
      [{ authorization: "Basic b3BzOnB3" }, /not a bearer token/],
      [bearer(generateApiKey()), /Incorrect API key/],
      [bearer(k.revokedAdmin), /Incorrect API key/],
    ];
    explained = 0;
    for (const [headers, message] of cases) {
      for (const req of [fetch(`${url}/debug/state`, { headers }), fetch(`${url}/debug/explain`, { method: "POST", headers, body: explainBody })]) {
        const r = await req;
        expect(r.status).toBe(401);
        expect(r.headers.get("www-authenticate")).toMatch(/^Bearer /);
        const body = (await r.json()) as { error: { type: string; code: string; message: string; param: null } };
        expect(body).toEqual({ error: { type: "authentication_error", code: "invalid_api_key", message: expect.stringMatching(message), param: null } });
        // Nothing of the state leaks, and the header is never echoed.
        expect(JSON.stringify(body)).not.toContain("secret-pod");
        if (headers.authorization) expect(JSON.stringify(body)).not.toContain(headers.authorization.split(" ")[1]);
      }
    }
    expect(explained, "explain must not run for an unauthorized request").toBe(0);
    // Unknown debug paths and query strings are behind the same check (no probing for endpoints).
    expect((await fetch(`${url}/debug/nope`)).status).toBe(401);
    expect((await fetch(`${url}/debug/state?x=1`)).status).toBe(401);
  });

  it("refuses a valid non-admin key with 403", async () => {
    const k = keys();
    const url = await start({ authorize: adminAuthorizer(k.view) });
    const r = await fetch(`${url}/debug/state`, { headers: bearer(k.client) });
    expect(r.status).toBe(403);
    const body = (await r.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("admin_key_required");
    expect(body.error.message).toMatch(/config add-key --admin/);
    const e = await fetch(`${url}/debug/explain`, { method: "POST", headers: bearer(k.client), body: explainBody });
    expect(e.status).toBe(403);
  });

  it("serves /debug/* to an admin key, and follows the live view (revocation, promotion)", async () => {
    const k = keys();
    const url = await start({ authorize: adminAuthorizer(k.view) });
    const s = await fetch(`${url}/debug/state`, { headers: bearer(k.admin) });
    expect(s.status).toBe(200);
    expect(await s.json()).toEqual({ pods: ["secret-pod"] });
    const e = await fetch(`${url}/debug/explain`, { method: "POST", headers: { ...bearer(k.admin), "content-type": "application/json" }, body: explainBody });
    expect(e.status).toBe(200);
    expect(await e.json()).toEqual({ pick: "p1" });

    // `config revoke-key` reaches the view: the next request is refused.
    k.view.set(hashApiKey(k.admin), rec({ admin: true, disabled: true, revokedAt: 1 }));
    expect((await fetch(`${url}/debug/state`, { headers: bearer(k.admin) })).status).toBe(401);
    // A record rewritten with admin: true promotes the key at once.
    k.view.set(hashApiKey(k.client), rec({ user: "alice", admin: true }));
    expect((await fetch(`${url}/debug/state`, { headers: bearer(k.client) })).status).toBe(200);
  });

  it("passes the authorization header to a custom authorize and uses its status", async () => {
    const seen: Array<string | undefined> = [];
    const url = await start({
      authorize: (a) => {
        seen.push(a);
        return a === "Bearer ok" ? { ok: true } : { ok: false, status: 403, reason: "no" };
      },
    });
    expect((await fetch(`${url}/debug/state`, { headers: { authorization: "Bearer ok" } })).status).toBe(200);
    expect((await fetch(`${url}/debug/state`)).status).toBe(403);
    expect(seen).toEqual(["Bearer ok", undefined]);
  });
});

describe("admin server without authorize (gateway --auth off)", () => {
  it("serves /debug/* to anyone", async () => {
    const url = await start();
    expect((await fetch(`${url}/debug/state`)).status).toBe(200);
    expect((await fetch(`${url}/debug/explain`, { method: "POST", body: explainBody })).status).toBe(200);
    expect((await fetch(`${url}/nope`)).status).toBe(404);
  });
});
