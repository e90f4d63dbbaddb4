/**
 * Bearer API-key authentication (`gateway --auth required`) end to end: real nats-server, keys
 * created and revoked with the real `jetroute config` CLI, real gRPC ext_proc streams.
 */
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { DecisionRecord } from "../schemas/events.js";
import { ExtProcClient, type PhaseResult } from "../services/extproc/envoy-client.js";
import { apiKeyBucketKey, hashApiKey } from "../services/gateway/auth.js";
import type { GatewayHandle } from "../services/gateway/gateway.js";
import { spawnJetroute } from "../services/shared/processes.js";
import { configBucketName } from "../streams/definitions.js";
import { MODEL, minuteStartClock, startTestEnv, type TestEnv, waitFor } from "./harness/env.js";

const chat = () => Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hello there" }], stream: true }));
const reqHeaders = (extra: Record<string, string> = {}) => ({ ":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json", ...extra });
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

interface CliResult {
  code: number | null;
  json: Array<Record<string, unknown>>;
  stderr: string;
}

async function cli(env: TestEnv, args: string[]): Promise<CliResult> {
  const p = spawnJetroute("config", ["config", ...args, "--nats", env.server.url]);
  let stderr = "";
  p.proc.stderr?.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const code = await p.exited;
  return { code, json: p.jsonLines as Array<Record<string, unknown>>, stderr };
}

async function addKey(env: TestEnv, user: string, name?: string): Promise<{ key: string; hash: string }> {
  const r = await cli(env, ["add-key", "--user", user, ...(name ? ["--name", name] : []), "--json"]);
  expect(r.code, r.stderr).toBe(0);
  const out = r.json[0] as { key: string; hash: string };
  return { key: out.key, hash: out.hash };
}

/** Sends request headers; returns the headers-phase result and the exchange. */
async function headersPhase(c: ExtProcClient, headers: Record<string, string>) {
  const ex = c.open();
  return { ex, r: await ex.requestHeaders(reqHeaders(headers)) };
}

function asError(r: PhaseResult) {
  if (r.kind !== "immediate") throw new Error(`expected an immediate response, got ${r.kind}`);
  return { status: r.status, headers: r.headers, body: JSON.parse(r.body.toString()) as { error: { message: string; type: string; code: string; param: null } } };
}

/** Headers then body; "routed" with the chosen endpoint, or the immediate status. */
async function send(c: ExtProcClient, headers: Record<string, string>): Promise<{ kind: "routed"; endpoint: string; userSet?: string } | { kind: "refused"; status: number; phase: "headers" | "body" }> {
  const { ex, r } = await headersPhase(c, headers);
  if (r.kind === "immediate") {
    ex.cancel();
    return { kind: "refused", status: r.status, phase: "headers" };
  }
  const b = await ex.requestBody(chat());
  ex.cancel();
  if (b.kind === "immediate") return { kind: "refused", status: b.status, phase: "body" };
  return { kind: "routed", endpoint: b.headerMutation.set["x-gateway-destination-endpoint"] as string, userSet: r.headerMutation.set.user };
}

async function metric(gw: GatewayHandle, pattern: RegExp): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${gw.adminPort}/metrics`)).text();
  const m = pattern.exec(text);
  return m ? Number(m[1]) : Number.NaN;
}

describe("auth - gateway --auth required", () => {
  let env: TestEnv;
  let a: GatewayHandle;
  let b: GatewayHandle;
  let ca: ExtProcClient;
  let cb: ExtProcClient;
  // Both replicas' clock starts at the beginning of a rate-limit minute; the per-minute test below
  // moves it to the next one's start, so it runs well inside one window however long the tests
  // before it took on a loaded host.
  const clock = minuteStartClock();
  beforeAll(async () => {
    env = await startTestEnv();
    for (let i = 0; i < 2; i++) await env.publishPod({ pod: `pod-${i}`, address: `127.0.0.1:${9100 + i}` });
    a = await env.gateway({ id: "auth-a", auth: "required", adminPort: 0, clock });
    b = await env.gateway({ id: "auth-b", auth: "required", clock });
    ca = new ExtProcClient(`127.0.0.1:${a.port}`);
    cb = new ExtProcClient(`127.0.0.1:${b.port}`);
  });
  afterAll(async () => {
    ca?.close();
    cb?.close();
    await env?.stop();
  });

  it("no authorization header -> 401 in the request-headers phase, OpenAI authentication_error, nothing charged or recorded", async () => {
    const decisions: DecisionRecord[] = [];
    const sub = env.nats.nc.subscribe(env.subjects.all("decisions"), { callback: (_e, m) => void decisions.push(m.json<DecisionRecord>()) });
    await env.nats.nc.flush();
    const before = await metric(a, /jetroute_gateway_auth_failures_total\{reason="missing",gateway="auth-a"\} (\d+)/);
    const { ex, r } = await headersPhase(ca, { "x-request-id": "anon-1", user: "mallory" });
    ex.cancel();
    const e = asError(r);
    expect(e.status).toBe(401);
    expect(e.headers["content-type"]).toBe("application/json");
    expect(e.headers["www-authenticate"]).toMatch(/^Bearer/);
    expect(e.body.error).toMatchObject({ type: "authentication_error", code: "invalid_api_key", param: null });
    expect(e.body.error.message).toMatch(/Authorization: Bearer/);
    expect(await metric(a, /jetroute_gateway_auth_failures_total\{reason="missing",gateway="auth-a"\} (\d+)/)).toBe(before + 1);
    // No charge, no rate-limit count, no decision record: unauthenticated traffic writes nothing.
    expect(a.views.ledger.size).toBe(0);
    expect(a.views.rates.userRequests("mallory", Date.now())).toBe(0);
    // A routed request after it proves the decision stream was flowing.
    const { key } = await addKey(env, "probe");
    await waitFor(() => a.apiKeys.size > 0, 3_000, "the key to reach the gateway");
    const ok = ca.open();
    await ok.requestHeaders(reqHeaders({ ...bearer(key), "x-request-id": "probe-1" }));
    await ok.requestBody(chat());
    ok.cancel();
    await waitFor(() => decisions.some((d) => d.id === "probe-1"), 3_000, "the routed request's decision");
    sub.unsubscribe();
    expect(decisions.filter((d) => d.id === "anon-1")).toEqual([]);
  });

  it("a stream that skips the request-headers phase (no key ever shown) is refused at its body, not routed", async () => {
    const ex = ca.open();
    const r = await ex.send("request_body", { request_body: { body: chat(), end_of_stream: true } });
    ex.cancel();
    const e = asError(r);
    expect(e.status).toBe(401);
    expect(e.body.error).toMatchObject({ type: "authentication_error", code: "invalid_api_key" });
    expect(a.views.ledger.size).toBe(0);
  });

  it("a malformed header or a key nobody issued -> 401, counted by reason", async () => {
    const unknown0 = await metric(a, /jetroute_gateway_auth_failures_total\{reason="unknown",gateway="auth-a"\} (\d+)/);
    const malformed0 = await metric(a, /jetroute_gateway_auth_failures_total\{reason="malformed",gateway="auth-a"\} (\d+)/);
    for (const headers of [bearer("jr-not-a-real-key"), bearer(hashApiKey("jr-x")), { authorization: "Basic YWxpY2U6c2VjcmV0" }, { authorization: "Bearer" }]) {
      const { ex, r } = await headersPhase(ca, headers);
      ex.cancel();
      const e = asError(r);
      expect(e.status).toBe(401);
      expect(e.body.error).toMatchObject({ type: "authentication_error", code: "invalid_api_key" });
    }
    expect(await metric(a, /jetroute_gateway_auth_failures_total\{reason="unknown",gateway="auth-a"\} (\d+)/)).toBe(unknown0 + 2);
    expect(await metric(a, /jetroute_gateway_auth_failures_total\{reason="malformed",gateway="auth-a"\} (\d+)/)).toBe(malformed0 + 2);
    // Listing models needs a key too.
    const ex = ca.open();
    const models = await ex.requestHeaders({ ":method": "GET", ":path": "/v1/models", ":authority": "gw" }, true);
    expect(models.kind === "immediate" && models.status).toBe(401);
  });

  it("GET /v1/models lists to a key restricted by --models only the models it may use", async () => {
    await env.publishPod({ pod: "other-0", address: "127.0.0.1:9150", model: "team-b/private-model" });
    const restricted = await cli(env, ["add-key", "--user", "eve", "--models", MODEL, "--json"]);
    expect(restricted.code, restricted.stderr).toBe(0);
    const { key: open } = await addKey(env, "frank");
    const eve = (restricted.json[0] as { key: string }).key;
    await waitFor(() => a.apiKeys.size >= 2 && a.views.pods.knows("team-b/private-model"), 5_000, "the keys and the other model to reach the gateway");
    const list = async (key: string) => {
      const ex = ca.open();
      const r = await ex.requestHeaders({ ":method": "GET", ":path": "/v1/models", ":authority": "gw", ...bearer(key) }, true);
      ex.cancel();
      if (r.kind !== "immediate") throw new Error(`expected an immediate response, got ${r.kind}`);
      return (JSON.parse(r.body.toString()) as { data: Array<{ id: string }> }).data.map((m) => m.id);
    };
    expect(await list(eve)).toEqual([MODEL]);
    expect(await list(open)).toEqual(expect.arrayContaining([MODEL, "team-b/private-model"]));
  });

  it("a key from `config add-key` routes on both replicas, as its user; only the hash is stored", async () => {
    const { key, hash } = await addKey(env, "carol", "ci");
    expect(key).toMatch(/^jr-[A-Za-z0-9_-]{43}$/);
    expect(hash).toBe(hashApiKey(key));
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const stored = await kv.get(apiKeyBucketKey(hash));
    expect(stored?.operation).toBe("PUT");
    expect(stored?.string()).not.toContain(key);
    expect(stored?.string()).not.toContain(key.slice(3));
    expect(stored?.json()).toMatchObject({ user: "carol", name: "ci" });

    await waitFor(() => a.apiKeys.get(hash) !== undefined && b.apiKeys.get(hash) !== undefined, 3_000, "the key on both replicas");
    for (const c of [ca, cb]) {
      const r = await send(c, { ...bearer(key), user: "someone-else" });
      expect(r).toMatchObject({ kind: "routed", userSet: "carol" });
    }
    // The charges carry the key's user, not the header's.
    await waitFor(() => a.views.ledger.size === 0 && b.views.ledger.size === 0, 3_000, "releases");
    const ex = ca.open();
    await ex.requestHeaders(reqHeaders({ ...bearer(key), user: "someone-else" }));
    await ex.requestBody(chat());
    const [held] = a.director.inFlight.values();
    expect(held?.user).toBe("carol");
    expect(held?.charge.user).toBe("carol");
    ex.cancel();

    // list-keys shows the key without its secret.
    const listed = await cli(env, ["list-keys", "--json"]);
    expect(listed.code).toBe(0);
    const row = listed.json.find((j) => j.hash === hash.slice(0, 12));
    expect(row).toMatchObject({ user: "carol", name: "ci", status: "active" });
    expect(JSON.stringify(listed.json)).not.toContain(key);
    expect(JSON.stringify(listed.json)).not.toContain(hash);
  });

  it("`config revoke-key <prefix>` refuses the key on both replicas within moments; other keys keep working", async () => {
    const dave = await addKey(env, "dave");
    const erin = await addKey(env, "erin");
    await waitFor(() => [a, b].every((g) => g.apiKeys.get(dave.hash) && g.apiKeys.get(erin.hash)), 3_000, "keys on both replicas");
    for (const c of [ca, cb]) expect((await send(c, bearer(dave.key))).kind).toBe("routed");

    const t0 = performance.now();
    const r = await cli(env, ["revoke-key", dave.hash.slice(0, 10)]);
    expect(r.code, r.stderr).toBe(0);
    const refusedAt: number[] = [];
    for (const c of [ca, cb]) {
      await waitFor(
        async () => {
          const res = await send(c, bearer(dave.key));
          if (res.kind !== "refused") return false;
          expect(res).toEqual({ kind: "refused", status: 401, phase: "headers" });
          return true;
        },
        2_000,
        "the revocation to reach a replica",
        10,
      );
      refusedAt.push(performance.now() - t0);
    }
    console.log(`revoke-key -> 401 on both replicas: ${refusedAt.map((t) => t.toFixed(0)).join(" ms, ")} ms after the CLI started`);
    for (const c of [ca, cb]) expect((await send(c, bearer(erin.key))).kind).toBe("routed");
    const listed = await cli(env, ["list-keys", "--json"]);
    expect(listed.json.find((j) => j.hash === dave.hash.slice(0, 12))).toMatchObject({ user: "dave", status: "revoked" });
    // Revoking again is harmless.
    expect((await cli(env, ["revoke-key", dave.key])).code).toBe(0);
  });

  it("revoke-key: clear errors for an unknown, an ambiguous and a malformed prefix", async () => {
    // Two entries whose hashes share a prefix, written straight into the bucket.
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    const h1 = "feedface01".padEnd(64, "1");
    const h2 = "feedface02".padEnd(64, "2");
    for (const h of [h1, h2]) await kv.put(apiKeyBucketKey(h), JSON.stringify({ user: "twin", createdAt: Date.now() }));
    const ambiguous = await cli(env, ["revoke-key", "feedface0"]);
    expect(ambiguous.code).toBe(2);
    expect(ambiguous.stderr).toMatch(/matches 2 keys/);
    expect(ambiguous.stderr).toContain(h1.slice(0, 12));
    const unknown = await cli(env, ["revoke-key", "0000000000"]);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/no API key hash starts with 0000000000/);
    const malformed = await cli(env, ["revoke-key", "xyz"]);
    expect(malformed.code).toBe(2);
    expect(malformed.stderr).toMatch(/hex digits/);
    // Neither twin was touched; a longer prefix resolves.
    expect((await kv.get(apiKeyBucketKey(h1)))?.json()).not.toHaveProperty("disabled");
    expect((await cli(env, ["revoke-key", "feedface02"])).code).toBe(0);
    expect((await kv.get(apiKeyBucketKey(h2)))?.json()).toMatchObject({ disabled: true });
    expect((await kv.get(apiKeyBucketKey(h1)))?.json()).not.toHaveProperty("disabled");
    // add-key refuses a user that cannot be a header value.
    expect((await cli(env, ["add-key", "--user", "bad\nuser"])).code).toBe(2);
    // Five CLI processes one after another: each a Node start-up, slow on a loaded 2-core host.
  }, 90_000);

  it("a record written around the CLI that does not validate refuses its key (fail closed)", async () => {
    const { key, hash } = await addKey(env, "frank");
    await waitFor(() => a.apiKeys.get(hash) !== undefined, 3_000, "the key");
    expect((await send(ca, bearer(key))).kind).toBe("routed");
    const kv = await new Kvm(env.nats.nc).open(configBucketName("jr"));
    await kv.put(apiKeyBucketKey(hash), JSON.stringify({ user: "frank", createdAt: 1, disabled: "yes" }));
    await waitFor(() => a.apiKeys.get(hash) === undefined, 3_000, "the invalid record to remove the key");
    expect(await send(ca, bearer(key))).toMatchObject({ kind: "refused", status: 401 });
  });

  it("the key's user, not a spoofed `user` header, is rate limited: alice at 2 rpm sending as user=bob gets 429 on the third", async () => {
    const set = await cli(env, ["set-limits", "--json", JSON.stringify({ users: { alice: { rpm: 2 }, bob: { rpm: 1000 } } })]);
    expect(set.code).toBe(0);
    const alice = await addKey(env, "alice");
    clock.nextMinute();
    await waitFor(() => [a, b].every((g) => g.apiKeys.get(alice.hash) && g.state.configs.userLimits("alice")?.rpm === 2), 3_000, "alice's key and limit");
    const results = [];
    // Spread over both replicas: the limit is shared. Each request's charge reaches both replicas
    // before the next (this test is about whose quota is spent, not about propagation races).
    for (let i = 0; i < 3; i++) {
      results.push(await send(i % 2 === 0 ? ca : cb, { ...bearer(alice.key), user: "bob" }));
      if (i < 2) await waitFor(() => [a, b].every((g) => g.views.rates.userRequests("alice", clock()) === i + 1), 3_000, "the charge on both replicas");
    }
    expect(results.map((r) => r.kind)).toEqual(["routed", "routed", "refused"]);
    expect(results[2]).toEqual({ kind: "refused", status: 429, phase: "body" });
    const now = clock();
    expect(a.views.rates.userRequests("bob", now)).toBe(0);
    expect(a.views.rates.userRequests("alice", now)).toBe(2);
    // Bob with his own key is not affected by alice's limit.
    const bob = await addKey(env, "bob");
    await waitFor(() => a.apiKeys.get(bob.hash) !== undefined, 3_000, "bob's key");
    expect((await send(ca, { ...bearer(bob.key), user: "alice" })).kind).toBe("routed");
  });
});

describe("auth - gateway --auth off (default)", () => {
  let env: TestEnv;
  beforeAll(async () => {
    env = await startTestEnv();
    await env.publishPod({ pod: "pod-0", address: "127.0.0.1:9200" });
  });
  afterAll(async () => env?.stop());

  it("ignores the authorization header and keeps the client's `user` header", async () => {
    const g = await env.gateway({ id: "noauth" });
    const c = new ExtProcClient(`127.0.0.1:${g.port}`);
    expect(await send(c, {})).toMatchObject({ kind: "routed" });
    expect(await send(c, bearer("jr-garbage"))).toMatchObject({ kind: "routed" });
    expect(await send(c, { authorization: "Basic Zm9vOmJhcg==" })).toMatchObject({ kind: "routed" });
    const ex = c.open();
    const h = await ex.requestHeaders(reqHeaders({ ...bearer("jr-garbage"), user: "zed" }));
    expect(h.kind === "continue" && h.headerMutation.set.user).toBeUndefined();
    await ex.requestBody(chat());
    expect([...g.director.inFlight.values()][0]?.user).toBe("zed");
    ex.cancel();
    c.close();
  });
});
