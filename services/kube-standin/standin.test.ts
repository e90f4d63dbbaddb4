import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitFor } from "../../test/harness/wait.js";
import { jsonPatch, mergePatch, stripDirectives } from "./patch.js";
import { matches, parseSelector, SelectorError } from "./selector.js";
import { KubeStandin } from "./server.js";
import { ApiError, ObjectStore } from "./store.js";

const podBody = (name: string, labels: Record<string, string> = { app: "x" }) => ({ apiVersion: "v1", kind: "Pod", metadata: { name, labels }, spec: { containers: [{ name: "c", image: "i" }] } });

describe("kube stand-in - pure parts", () => {
  it("label selectors", () => {
    const sel = parseSelector("model.aibrix.ai/name, tier in (a, b), env!=prod, !legacy");
    expect(matches(sel, { "model.aibrix.ai/name": "m", tier: "a", env: "dev" })).toBe(true);
    expect(matches(sel, { "model.aibrix.ai/name": "m", tier: "c" })).toBe(false);
    expect(matches(sel, { "model.aibrix.ai/name": "m", tier: "a", env: "prod" })).toBe(false);
    expect(matches(sel, { "model.aibrix.ai/name": "m", tier: "b", legacy: "1" })).toBe(false);
    expect(matches(parseSelector("a=1"), { a: "1" })).toBe(true);
    expect(matches(parseSelector("a==1"), { a: "2" })).toBe(false);
    expect(() => parseSelector("bad key=1")).toThrow(SelectorError);
  });
  it("merge, strategic-merge and JSON patches", () => {
    expect(mergePatch({ a: { b: 1, c: 2 }, d: [1] }, { a: { b: null, e: 3 }, d: [2] })).toEqual({ a: { c: 2, e: 3 }, d: [2] });
    expect(stripDirectives({ metadata: { labels: { x: "1" } }, $setElementOrder: [], spec: { "$setElementOrder/containers": [{ name: "c" }] } })).toEqual({ metadata: { labels: { x: "1" } }, spec: {} });
    expect(jsonPatch({ a: [1, 2], b: { c: 1 } }, [{ op: "add", path: "/a/-", value: 3 }, { op: "remove", path: "/b/c" }, { op: "replace", path: "/x", value: "y" }])).toEqual({ a: [1, 2, 3], b: {}, x: "y" });
  });
  it("store: resourceVersions, conflicts, status only via the subresource, bounded history -> expired", () => {
    const s = new ObjectStore({ historySize: 3 });
    const a = s.create("pods", "ns", { ...podBody("a"), status: { podIP: "1.2.3.4" } }, 0);
    expect(a.metadata.resourceVersion).toBe("1");
    expect(a.status).toEqual({ phase: "Pending" }); // status from a create is dropped
    expect(() => s.create("pods", "ns", podBody("a"), 0)).toThrow(expect.objectContaining({ code: 409, reason: "AlreadyExists" }));
    const stale = structuredClone(a);
    s.patch("pods", "ns", "a", "application/merge-patch+json", { metadata: { labels: { app: "y" } }, status: { podIP: "9.9.9.9" } });
    expect(s.get("pods", "ns", "a").status).toEqual({ phase: "Pending" });
    expect(() => s.replace("pods", "ns", "a", stale)).toThrow(expect.objectContaining({ code: 409, reason: "Conflict" }));
    s.patch("pods", "ns", "a", "application/merge-patch+json", { status: { podIP: "9.9.9.9" } }, "status");
    expect(s.get("pods", "ns", "a").status?.podIP).toBe("9.9.9.9");
    s.patch("pods", "ns", "a", "application/merge-patch+json", { metadata: { labels: { app: "z" } } });
    // A no-op write is not an event.
    const rv = s.resourceVersion;
    s.patch("pods", "ns", "a", "application/merge-patch+json", { metadata: { labels: { app: "z" } } });
    expect(s.resourceVersion).toBe(rv);
    // History holds 3 events (rv 2..4): from rv 0 is too old, from rv 1 replays all three.
    expect(s.eventsSince(0)).toBe("expired");
    expect((s.eventsSince(1) as Array<{ rv: number }>).map((e) => e.rv)).toEqual([2, 3, 4]);
    s.compact();
    expect(s.eventsSince(1)).toBe("expired");
    expect(s.eventsSince(Number(s.resourceVersion))).toEqual([]);
    expect(() => s.get("pods", "ns", "nope")).toThrow(ApiError);
    expect(() => s.create("pods", "ns", podBody("Bad_Name"), 0)).toThrow(expect.objectContaining({ code: 422 }));
  });
  it("store: graceful delete marks terminating, finalize removes", () => {
    const s = new ObjectStore();
    s.create("pods", "ns", podBody("t"), 0);
    const t = s.delete("pods", "ns", "t", 1_000, 5_000);
    expect(t.metadata.deletionTimestamp).toBe("1970-01-01T00:00:06Z");
    s.finalize("ns", "t");
    expect(() => s.get("pods", "ns", "t")).toThrow(expect.objectContaining({ code: 404 }));
  });
});

/** Reads a watch response line by line until `until` says stop. */
async function readWatch(url: string, until: (events: Array<{ type: string; object: { metadata?: { name?: string; resourceVersion?: string }; code?: number } }>) => boolean, timeoutMs = 5_000) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), timeoutMs);
  const res = await fetch(url, { signal: ac.signal });
  expect(res.headers.get("transfer-encoding")).toBe("chunked");
  const events: Array<{ type: string; object: { metadata?: { name?: string; resourceVersion?: string }; code?: number } }> = [];
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  let buf = "";
  try {
    while (!until(events)) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += new TextDecoder().decode(value);
      let nl = buf.indexOf("\n");
      while (nl >= 0) {
        events.push(JSON.parse(buf.slice(0, nl)));
        buf = buf.slice(nl + 1);
        nl = buf.indexOf("\n");
      }
    }
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  return events;
}

describe("kube stand-in - the list/watch protocol over HTTP", () => {
  let k: KubeStandin;
  beforeAll(async () => {
    k = await new KubeStandin({ bookmarkIntervalMs: 50, historySize: 50 }).start();
  });
  afterAll(async () => k?.stop());
  const api = (p: string, init?: RequestInit) => fetch(`${k.url}${p}`, init);
  const post = (ns: string, body: unknown) => api(`/api/v1/namespaces/${ns}/pods`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });

  it("lists with a selector and pages with limit/continue at one resourceVersion", async () => {
    for (const n of ["p1", "p2", "p3"]) expect((await post("ns1", podBody(n, { app: "inf" }))).status).toBe(201);
    expect((await post("ns2", podBody("other", { app: "web" }))).status).toBe(201);
    const page1 = (await (await api("/api/v1/pods?labelSelector=app%3Dinf&limit=2")).json()) as { metadata: { continue?: string; resourceVersion: string }; items: Array<{ metadata: { name: string } }> };
    expect(page1.items.map((i) => i.metadata.name)).toEqual(["p1", "p2"]);
    const page2 = (await (await api(`/api/v1/pods?labelSelector=app%3Dinf&limit=2&continue=${page1.metadata.continue}`)).json()) as typeof page1;
    expect(page2.items.map((i) => i.metadata.name)).toEqual(["p3"]);
    expect(page2.metadata.continue).toBeUndefined();
    expect(page2.metadata.resourceVersion).toBe(page1.metadata.resourceVersion);
    const notFound = await api("/api/v1/namespaces/ns1/pods/nope");
    expect(notFound.status).toBe(404);
    expect(await notFound.json()).toMatchObject({ kind: "Status", reason: "NotFound", code: 404 });
  });

  it("watches from a resourceVersion: replayed history, live events, selector transitions, bookmarks", async () => {
    const list = (await (await api("/api/v1/namespaces/ns1/pods?labelSelector=app%3Dinf")).json()) as { metadata: { resourceVersion: string } };
    // A change before the watch opens (replayed from history) and after (live).
    await api("/api/v1/namespaces/ns1/pods/p1/status", { method: "PATCH", body: JSON.stringify({ status: { podIP: "10.0.0.1" } }), headers: { "content-type": "application/merge-patch+json" } });
    const watches = k.stats.watches;
    const watching = readWatch(`${k.url}/api/v1/namespaces/ns1/pods?watch=true&labelSelector=app%3Dinf&allowWatchBookmarks=true&resourceVersion=${list.metadata.resourceVersion}`, (ev) => ev.filter((e) => e.type !== "BOOKMARK").length >= 4 && ev[ev.length - 1]?.type === "BOOKMARK");
    await waitFor(() => k.stats.watches > watches, 5_000, "the watch to be open on the server");
    // Out of the selector -> DELETED for this watcher; back in -> ADDED; then a real delete.
    await api("/api/v1/namespaces/ns1/pods/p2", { method: "PATCH", body: JSON.stringify({ metadata: { labels: { app: "web" } } }), headers: { "content-type": "application/merge-patch+json" } });
    await api("/api/v1/namespaces/ns1/pods/p2", { method: "PATCH", body: JSON.stringify({ metadata: { labels: { app: "inf" } } }), headers: { "content-type": "application/strategic-merge-patch+json" } });
    await api("/api/v1/namespaces/ns1/pods/p3", { method: "DELETE" });
    const events = await watching;
    const seen = events.filter((e) => e.type !== "BOOKMARK").map((e) => `${e.type} ${e.object.metadata?.name}`);
    expect(seen).toEqual(["MODIFIED p1", "DELETED p2", "ADDED p2", "DELETED p3"]);
    const rvs = events.filter((e) => e.type !== "BOOKMARK").map((e) => Number(e.object.metadata?.resourceVersion));
    expect([...rvs].sort((a, b) => a - b)).toEqual(rvs);
    const bookmark = events[events.length - 1];
    expect(bookmark?.type).toBe("BOOKMARK");
    expect(Number(bookmark?.object.metadata?.resourceVersion)).toBeGreaterThanOrEqual(rvs[rvs.length - 1] as number);
  });

  it("a resourceVersion older than the history gets an ERROR event with Status 410 Expired", async () => {
    k.store.compact();
    const events = await readWatch(`${k.url}/api/v1/pods?watch=true&resourceVersion=1`, (ev) => ev.length > 0);
    expect(events[0]).toMatchObject({ type: "ERROR", object: { kind: "Status", code: 410, reason: "Expired" } });
  });

  it("a watch without a resourceVersion starts with the current state as ADDED", async () => {
    const events = await readWatch(`${k.url}/api/v1/namespaces/ns1/pods?watch=1`, (ev) => ev.length >= 2);
    expect(events.map((e) => `${e.type} ${e.object.metadata?.name}`)).toEqual(["ADDED p1", "ADDED p2"]);
  });

  it("ends a watch after timeoutSeconds; cutWatches drops open ones", async () => {
    const t0 = Date.now();
    const events = await readWatch(`${k.url}/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion=${k.store.resourceVersion}`, () => false, 5_000);
    expect(events).toEqual([]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    const watches = k.stats.watches;
    const res = await fetch(`${k.url}/api/v1/pods?watch=true&resourceVersion=${k.store.resourceVersion}`);
    await waitFor(() => k.stats.watches > watches, 5_000, "the watch to be open on the server");
    expect(k.cutWatches()).toBe(1);
    await expect(res.text()).rejects.toThrow();
  });

  it("fault injection: forbid answers list and watch with a 403 Status; muteWatches leaves a watch open with nothing, ever, on it", async () => {
    k.forbid("pods");
    const refused = await api("/api/v1/namespaces/ns1/pods?watch=true");
    expect(refused.status).toBe(403);
    expect(await refused.json()).toMatchObject({ kind: "Status", reason: "Forbidden", code: 403 });
    expect((await api("/api/v1/pods")).status).toBe(403);
    k.forbid("pods", false);
    expect((await api("/api/v1/pods")).status).toBe(200);
    // A watch with a 1 s timeout and bookmarks every 50 ms: muted, it neither ends nor delivers.
    const bookmarks = k.stats.bookmarks;
    const ctl = new AbortController();
    const watches = k.stats.watches;
    const res = await fetch(`${k.url}/api/v1/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion=${k.store.resourceVersion}`, { signal: ctl.signal });
    await waitFor(() => k.stats.watches > watches, 5_000, "the watch to be open on the server");
    expect(k.muteWatches()).toBe(1);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    let received = 0;
    const reading = (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return "ended";
        received += value.length;
      }
    })().catch(() => "aborted");
    // Until well past its 1 s timeout: the server's bookmark timer (50 ms) keeps firing on it, unsent.
    await waitFor(() => k.stats.bookmarks >= bookmarks + 30, 10_000, "30 bookmark ticks on the muted watch", 20);
    expect(k.stats.bookmarks).toBeGreaterThanOrEqual(bookmarks + 30);
    ctl.abort();
    expect(await reading).toBe("aborted");
    expect(received).toBeLessThanOrEqual(200); // at most what arrived before the mute
  });

  it("leases: create, optimistic replace (409 on a stale resourceVersion), AlreadyExists", async () => {
    const path = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases";
    const lease = { apiVersion: "coordination.k8s.io/v1", kind: "Lease", metadata: { name: "l" }, spec: { holderIdentity: "a", leaseDurationSeconds: 15 } };
    const created = (await (await api(path, { method: "POST", body: JSON.stringify(lease) })).json()) as { metadata: { resourceVersion: string } };
    expect((await api(path, { method: "POST", body: JSON.stringify(lease) })).status).toBe(409);
    const put = (rv: string, holder: string) => api(`${path}/l`, { method: "PUT", body: JSON.stringify({ ...lease, metadata: { name: "l", resourceVersion: rv }, spec: { holderIdentity: holder, leaseDurationSeconds: 15 } }) });
    expect((await put(created.metadata.resourceVersion, "b")).status).toBe(200);
    const lost = await put(created.metadata.resourceVersion, "c");
    expect(lost.status).toBe(409);
    expect(await lost.json()).toMatchObject({ reason: "Conflict" });
    expect(((await (await api(`${path}/l`)).json()) as { spec: { holderIdentity: string } }).spec.holderIdentity).toBe("b");
  });
});
