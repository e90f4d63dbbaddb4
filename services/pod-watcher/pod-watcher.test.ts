import { mkdtempSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PodEvent, PodSourceHeartbeat } from "../../schemas/events.js";
import { applyStreams } from "../../streams/apply.js";
import { streamName } from "../../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { StreamFollower } from "../shared/follower.js";
import { PodSet } from "../views/pod-set.js";
import { spawnJetroute } from "../shared/processes.js";
import { kvLeaseStore } from "../shared/kv-lease.js";
import { parsePodList, PodListError } from "./static-pods.js";
import { type PodWatcherHandle, startPodWatcher, staticLeaseKey, staticPodState } from "./pod-watcher.js";

describe("static pod list - parsing", () => {
  it("accepts YAML and JSON, bare arrays and {pods}", () => {
    expect(parsePodList("pods:\n  - {name: a, model: m, address: '10.0.0.1:8000'}")).toHaveLength(1);
    expect(parsePodList('[{"name":"a","model":"m","address":"10.0.0.1:8000","engine":"sglang"}]')[0]?.engine).toBe("sglang");
  });
  it.each([
    ["pods: 3", /expected a list/],
    ["- {name: a, model: m}", /pods\[0\].*address/],
    ["- {name: a, model: m, address: nohost}", /pods\[0\]\/address/],
    ["- {name: a, model: m, address: 'h:1', role: boss}", /pods\[0\]\/role/],
    ["- {name: a, model: m, address: 'h:1', schedulingPolicy: edf}", /pods\[0\]\/schedulingPolicy/],
    ["- {name: a, model: m, address: 'h:1'}\n- {name: a, model: m, address: 'h:2'}", /duplicate pod "a"/],
    ["- [unclosed", /not valid YAML/],
  ])("rejects %j naming the problem", (text, msg) => {
    expect(() => parsePodList(text, "pods.yaml")).toThrow(PodListError);
    expect(() => parsePodList(text, "pods.yaml")).toThrow(msg);
  });
});

describe("static pod list - scheduling policy", () => {
  it("publishes priority / priority-low-values-first and leaves fcfs out, so such a pod gets no priority", () => {
    const [a, b, c] = parsePodList(
      "- {name: a, model: m, address: 'h:1', schedulingPolicy: priority}\n" +
        "- {name: b, model: m, address: 'h:2', engine: sglang, schedulingPolicy: priority-low-values-first}\n" +
        "- {name: c, model: m, address: 'h:3', schedulingPolicy: fcfs}",
    );
    expect(staticPodState(a as never, true).schedulingPolicy).toBe("priority");
    expect(staticPodState(b as never, true).schedulingPolicy).toBe("priority-low-values-first");
    expect(staticPodState(c as never, true)).not.toHaveProperty("schedulingPolicy");
  });
});

describe("pod-watcher (static) - ownership, liveness, HA, on a real nats-server", () => {
  let env: TestEnv;
  let healthy = true;
  let engine: http.Server;
  let enginePort = 0;
  const view = new PodSet();
  let follower: StreamFollower<"pod" | "pod-source">;
  const dir = mkdtempSync(path.join(os.tmpdir(), "jr-pw-"));
  const watchers: PodWatcherHandle[] = [];
  const list = (file: string, names: string[], port = () => enginePort) => {
    const p = path.join(dir, file);
    writeFileSync(p, names.length === 0 ? "pods: []\n" : `pods:\n${names.map((n) => `  - {name: ${n}, model: ${MODEL}, address: '127.0.0.1:${n.startsWith("dead") ? 1 : port()}'}`).join("\n")}\n`);
    return p;
  };
  const watch = async (o: Parameters<typeof startPodWatcher>[0]) => {
    const w = await startPodWatcher(o);
    watchers.push(w);
    return w;
  };

  beforeAll(async () => {
    env = await startTestEnv();
    engine = http.createServer((_req, res) => {
      res.writeHead(healthy ? 200 : 503);
      res.end();
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    enginePort = (engine.address() as { port: number }).port;
    follower = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test", family: "pods", types: ["pod", "pod-source"] as const,
      stream: streamName("jr", "PODS"), startAt: { kind: "all" },
      onEvent: (ev, m) => (ev.type === "pod" ? view.apply(ev, m.seq, m.serverTs) : view.applySource(ev, m.serverTs)),
    });
    await follower.start();
  });
  afterAll(async () => {
    for (const w of watchers) await w.close().catch(() => undefined);
    await follower?.stop();
    engine?.close();
    await env?.stop();
  });

  it("publishes probe results, follows health changes, removes its own pods that leave the list and never another source's", async () => {
    // Pods of this source from an earlier run that are no longer listed are removed at start;
    // another source's pod (and a pod from before sources existed) are left alone.
    await env.publishPod({ pod: "ghost", address: "127.0.0.1:1", source: "static-list-a" });
    await env.publishPod({ pod: "foreign", address: "127.0.0.1:2", source: "static-other" });
    await env.publishPod({ pod: "legacy", address: "127.0.0.1:3" });
    await waitFor(() => view.get(MODEL, "ghost") !== undefined && view.get(MODEL, "legacy") !== undefined, 2_000, "seeded pods");

    const file = list("list-a.yaml", ["live.0", "dead"]);
    const w = await watch({ nats: env.server.url, file, probeIntervalMs: 100, probeTimeoutMs: 300, heartbeatMs: 200, log: quietLog });
    expect(w.source).toBe("static-list-a");
    await w.firstRound;
    await waitFor(() => view.get(MODEL, "live.0")?.ready === true && view.get(MODEL, "dead")?.ready === false, 3_000, "first round in the view");
    expect(view.get(MODEL, "live.0")?.source).toBe("static-list-a");
    await waitFor(() => view.get(MODEL, "ghost") === undefined, 2_000, "ghost removed");
    expect(view.get(MODEL, "foreign")).toBeDefined();
    expect(view.get(MODEL, "legacy")).toBeDefined();

    healthy = false;
    await waitFor(() => view.get(MODEL, "live.0")?.ready === false, 3_000, "pod turning unready");
    healthy = true;
    await waitFor(() => view.get(MODEL, "live.0")?.ready === true, 3_000, "pod ready again");

    list("list-a.yaml", ["live.0"]);
    await waitFor(() => view.get(MODEL, "dead") === undefined, 5_000, "removal after the list changed");
    expect(view.get(MODEL, "foreign")).toBeDefined();
    await w.close();
  });

  it("a second watcher with another list adds its pods and removes none of the first's", async () => {
    const a = await watch({ nats: env.server.url, file: list("east.yaml", ["east-0", "east-1"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await a.firstRound;
    const b = await watch({ nats: env.server.url, file: list("west.yaml", ["west-0"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await b.firstRound;
    await waitFor(() => ["east-0", "east-1", "west-0"].every((n) => view.get(MODEL, n)?.ready), 3_000, "both sources' pods");
    // The second watcher's list shrinks to nothing: only its pod goes.
    list("west.yaml", []);
    await waitFor(() => view.get(MODEL, "west-0") === undefined, 5_000, "west pod removed");
    expect(view.get(MODEL, "east-0")?.ready).toBe(true);
    expect(view.get(MODEL, "east-1")?.ready).toBe(true);
    // The first keeps publishing: its pods follow their health.
    healthy = false;
    await waitFor(() => view.get(MODEL, "east-0")?.ready === false, 3_000, "east pod unready");
    healthy = true;
    await waitFor(() => view.get(MODEL, "east-0")?.ready === true, 3_000, "east pod ready");
    await a.close();
    await b.close();
  });

  it("a pod two sources list stays with its live owner; when the owner drops it, the other publishes it (never removed for good)", async () => {
    const owners: string[] = [];
    const f = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-share", family: "pods", types: ["pod"] as const,
      stream: streamName("jr", "PODS"), filter: env.subjects.all("pods"), startAt: { kind: "all" },
      onEvent: (ev) => {
        if (ev.pod === "shared-0") owners.push(`${ev.action}:${ev.source ?? ""}`);
      },
    });
    await f.start();
    try {
      const a = await watch({ nats: env.server.url, file: list("share-a.yaml", ["shared-0", "only-a"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
      await a.firstRound;
      await waitFor(() => view.get(MODEL, "shared-0")?.source === "static-share-a", 3_000, "A publishes the shared pod");
      const b = await watch({ nats: env.server.url, file: list("share-b.yaml", ["shared-0"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
      await b.firstRound;
      await waitFor(() => (b.stats.conflicts ?? 0) > 0, 3_000, "B reports the conflict");
      expect(view.get(MODEL, "shared-0")?.source).toBe("static-share-a");
      // A drops it: A removes its own pod, and B, which lists it, publishes it as B's at once.
      list("share-a.yaml", ["only-a"]);
      await waitFor(() => view.get(MODEL, "shared-0")?.source === "static-share-b", 8_000, "B publishes the pod A dropped");
      const rounds = a.stats.probeRounds ?? 0;
      await waitFor(() => (a.stats.probeRounds ?? 0) >= rounds + 3, 3_000, "A probed the new list again");
      expect(view.get(MODEL, "shared-0")).toMatchObject({ source: "static-share-b", ready: true });
      // No tug of war: A's publishes, A's one removal, then B's.
      const firstB = owners.indexOf("upsert:static-share-b");
      expect(owners.slice(0, firstB).every((o) => o.endsWith(":static-share-a"))).toBe(true);
      expect(owners.slice(firstB).every((o) => o === "upsert:static-share-b")).toBe(true);
      await a.close();
      await b.close();
    } finally {
      await f.stop();
    }
  });

  it("a purged PODS is repaired at the next heartbeat, not at the next re-assertion", async () => {
    const w = await watch({ nats: env.server.url, file: list("purge.yaml", ["purge-0"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await w.firstRound;
    const last = async () => {
      try {
        return (await env.nats.jsm.streams.getMessage(streamName("jr", "PODS"), { last_by_subj: env.subjects.pod(MODEL, "purge-0") }))?.json<PodEvent>();
      } catch {
        return undefined;
      }
    };
    expect((await last())?.source).toBe("static-purge");
    await env.nats.jsm.streams.purge(streamName("jr", "PODS"));
    expect(await last()).toBeUndefined();
    // Re-assertion is 10 minutes away (the default): only the repair can bring the pod back.
    let ev: PodEvent | undefined;
    await waitFor(async () => (ev = await last()) !== undefined, 10_000, "the repair to republish the pod", 50);
    expect(ev).toMatchObject({ pod: "purge-0", ready: true, source: "static-purge" });
    expect(w.stats.reloads).toBeGreaterThan(1);
    await w.close();
  });

  it("a gateway stops routing to a killed watcher's pods after --pod-source-timeout, and routes again when it is back", async () => {
    const gw = await env.gateway({ id: "gw-liveness", podSourceTimeoutMs: 1_500 });
    const file = list("lively.yaml", ["lively-0"]);
    const w = await watch({ nats: env.server.url, file, probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await w.firstRound;
    const routable = () => gw.views.pods.readyPods(MODEL).some((p) => p.pod === "lively-0");
    await waitFor(routable, 3_000, "routable while the watcher is alive");
    // Alive and heartbeating: still routable after heartbeats spanning more than the timeout.
    const heard = () => gw.state.pods.sourceInfo().find((x) => x.source === "static-lively")?.lastSeen ?? 0;
    const first = heard();
    await waitFor(() => heard() > first + 2_000, 4_000, "heartbeats spanning 2 s");
    expect(routable()).toBe(true);
    await w.close({ release: false });
    const gone = await waitFor(() => !routable(), 5_000, "not routable after the timeout");
    expect(gone).toBeGreaterThan(1_000);
    expect(gw.views.pods.get(MODEL, "lively-0")?.ready).toBe(true); // still published, just unvouched
    const again = await watch({ nats: env.server.url, file, probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await again.firstRound;
    await waitFor(routable, 3_000, "routable again");
    await again.close();
  });

  it("a lone gateway whose clock runs a minute ahead judges source liveness on broker time (fed by PODS heartbeats)", async () => {
    // Alone: no peer's CHARGES to learn the broker's clock from; the watcher's heartbeats must do.
    const gw = await env.gateway({ id: "gw-skewed", podSourceTimeoutMs: 2_000, clock: () => Date.now() + 60_000, adminPort: 0 });
    const w = await watch({ nats: env.server.url, file: list("skew.yaml", ["skew-0"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await w.firstRound;
    const routable = () => gw.views.pods.readyPods(MODEL).some((p) => p.pod === "skew-0");
    await waitFor(routable, 5_000, "routable despite the skewed clock");
    // On the local clock every source would be a minute old: silent at every sweep (and live again
    // for a moment at each heartbeat). Sample while heartbeats span more than the timeout.
    const samples: boolean[] = [];
    const sampler = setInterval(() => samples.push(routable()), 20);
    const heard = () => gw.state.pods.sourceInfo().find((x) => x.source === "static-skew")?.lastSeen ?? 0;
    const first = heard();
    try {
      await waitFor(() => heard() > first + 2_500, 6_000, "heartbeats spanning more than the timeout");
    } finally {
      clearInterval(sampler);
    }
    expect(samples.length).toBeGreaterThan(10);
    expect(samples.filter((r) => !r)).toEqual([]);
    const text = await (await fetch(`http://127.0.0.1:${gw.adminPort}/metrics`)).text();
    expect(text).toMatch(/jetroute_gateway_pod_sources\{state="live"[^}]*\} [1-9]/);
    await w.close();
  });

  it("two watchers without leader election that derive the same source (same file name, other hosts) detect the clash: the older refuses to publish", async () => {
    const other = mkdtempSync(path.join(os.tmpdir(), "jr-pw-other-"));
    const fileA = list("clash.yaml", ["clash-a"]);
    const fileB = path.join(other, "clash.yaml");
    writeFileSync(fileB, `pods:\n  - {name: clash-b, model: ${MODEL}, address: '127.0.0.1:${enginePort}'}\n`);
    const a = await watch({ nats: env.server.url, file: fileA, probeIntervalMs: 100, heartbeatMs: 200, watcherId: "clash-one", log: quietLog });
    await a.firstRound;
    const b = await watch({ nats: env.server.url, file: fileB, probeIntervalMs: 100, heartbeatMs: 200, watcherId: "clash-two", log: quietLog });
    expect([a.source, b.source]).toEqual(["static-clash", "static-clash"]);
    await b.firstRound;
    await waitFor(() => a.stats.clash === 1, 3_000, "the first watcher sees another watcher heartbeat its source");
    // Refusing, it stops publishing (no heartbeats, no pod changes): no tug of war over the pods.
    const [hb, pub] = [a.stats.heartbeats, a.stats.published + a.stats.removed];
    const bBeats = b.stats.heartbeats;
    await waitFor(() => b.stats.heartbeats > bBeats + 5, 3_000, "the other keeps beating");
    expect([a.stats.heartbeats, a.stats.published + a.stats.removed]).toEqual([hb, pub]);
    await a.close();
    await b.close();
  });

  it("re-asserts unchanged pods so retention never ages them out", async () => {
    const w = await watch({ nats: env.server.url, file: list("reassert.yaml", ["steady-0"]), probeIntervalMs: 100, heartbeatMs: 100, reassertMs: 300, log: quietLog });
    await w.firstRound;
    await waitFor(() => view.get(MODEL, "steady-0") !== undefined, 2_000, "first publish seen");
    const first = view.get(MODEL, "steady-0")?.updatedAt ?? 0;
    await waitFor(() => (view.get(MODEL, "steady-0")?.updatedAt ?? 0) > first + 250, 3_000, "a re-assertion");
    expect(w.stats.reasserted).toBeGreaterThan(0);
    await w.close();
  });

  it("a pod whose subject was purged is published again: the refused re-assertion finds no message and reads PODS afresh", async () => {
    const w = await watch({ nats: env.server.url, file: list("purged.yaml", ["purged-0", "kept-0"]), probeIntervalMs: 100, heartbeatMs: 100, reassertMs: 300, log: quietLog });
    await w.firstRound;
    const subject = env.subjects.pod(MODEL, "purged-0");
    const lastOn = () => env.nats.jsm.streams.getMessage(streamName("jr", "PODS"), { last_by_subj: subject });
    await waitFor(() => view.get(MODEL, "purged-0") !== undefined, 2_000, "first publish seen");
    const reloads = w.stats.reloads;
    // An operator's purge of one subject: the watcher still expects its last sequence there.
    await env.nats.jsm.streams.purge(streamName("jr", "PODS"), { filter: subject });
    expect(await lastOn()).toBeNull();
    let again: Awaited<ReturnType<typeof lastOn>> = null;
    const t0 = Date.now();
    while (!again && Date.now() - t0 < 5_000) {
      again = await lastOn();
      if (!again) await new Promise((r) => setTimeout(r, 50));
    }
    expect(again?.json<PodEvent>()).toMatchObject({ pod: "purged-0", source: "static-purged" });
    expect(w.stats.raced).toBeGreaterThan(0);
    expect(w.stats.reloads).toBeGreaterThan(reloads);
    await w.close();
  });

  it("retries a publish that failed (PODS gone) until it lands", async () => {
    const w = await watch({ nats: env.server.url, file: list("retry.yaml", ["retry-0"]), probeIntervalMs: 100, heartbeatMs: 200, log: quietLog });
    await w.firstRound;
    await follower.stop();
    await env.nats.jsm.streams.delete(streamName("jr", "PODS"));
    healthy = false;
    await waitFor(() => w.stats.publishFailures > 0, 5_000, "a failed publish");
    await applyStreams(env.nats.nc, env.nats.jsm);
    const last = async () => {
      try {
        const m = await env.nats.jsm.streams.getMessage(streamName("jr", "PODS"), { last_by_subj: env.subjects.pod(MODEL, "retry-0") });
        return m?.json<PodEvent>();
      } catch {
        return undefined;
      }
    };
    let ev: PodEvent | undefined;
    await waitFor(async () => (ev = await last())?.ready === false, 10_000, "the pod published not ready", 50);
    expect(ev).toMatchObject({ pod: "retry-0", ready: false, source: "static-retry" });
    healthy = true;
    await w.close();
  });

  it("HA pair on a NATS KV lease: one publishes; kill it and the other takes over within the lease", async () => {
    const leaseMs = 1_500;
    // A fresh view: the stream was recreated by the previous test.
    const hbs: PodSourceHeartbeat[] = [];
    const f = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test-ha", family: "podsrc", types: ["pod-source"] as const,
      stream: streamName("jr", "PODS"), filter: env.subjects.all("podsrc"), startAt: { kind: "all" }, onEvent: (ev) => hbs.push(ev),
    });
    await f.start();
    try {
      const file = list("ha.yaml", ["ha-0"]);
      const opts = { nats: env.server.url, file, probeIntervalMs: 100, heartbeatMs: 100, leaderElection: true, leaseMs, log: quietLog };
      const one = await watch({ ...opts, watcherId: "ha-one" });
      await waitFor(() => one.isLeader(), 3_000, "first leader");
      const two = await watch({ ...opts, watcherId: "ha-two" });
      await one.firstRound;
      // Only the leader heartbeats.
      const since = hbs.length;
      await waitFor(() => hbs.slice(since).filter((h) => h.source === "static-ha").length > 5, 3_000, "heartbeats");
      expect(new Set(hbs.slice(since).filter((h) => h.source === "static-ha").map((h) => h.watcher))).toEqual(new Set(["ha-one"]));
      expect(two.isLeader()).toBe(false);
      const killedAt = performance.now();
      await one.close({ release: false });
      await waitFor(() => hbs.some((h) => h.source === "static-ha" && h.watcher === "ha-two"), 3 * leaseMs, "the standby's first heartbeat");
      // Expiry is judged on the standby's clock from when it last saw the lease change: a lease
      // plus at most two renewal intervals after the kill (the waitFor bound has room for a loaded machine).
      expect(performance.now() - killedAt).toBeGreaterThan(leaseMs / 2);
      expect(two.isLeader()).toBe(true);
      // Never two publishers: in stream order, once the standby beat, the old leader never did again.
      const ha = hbs.filter((h) => h.source === "static-ha").map((h) => h.watcher);
      const firstTwo = ha.indexOf("ha-two");
      expect(ha.slice(firstTwo).every((w) => w === "ha-two")).toBe(true);
      expect(ha.slice(0, firstTwo).every((w) => w === "ha-one")).toBe(true);
      await two.close();
    } finally {
      await f.stop();
    }
  });

  it("SIGTERM while the first round cannot complete (PODS missing) still closes the process and releases its lease", async () => {
    // An engine that accepts and never answers: the first probe round takes the whole probe timeout,
    // so the watcher is leader (and owes a publish it cannot make) before its first round ends.
    const mute = net.createServer(() => undefined);
    await new Promise<void>((r) => mute.listen(0, "127.0.0.1", r));
    const file = list("sigterm.yaml", ["sig-0"], () => (mute.address() as net.AddressInfo).port);
    const store = await kvLeaseStore(env.nats, "jr", staticLeaseKey("static-sigterm"));
    await env.nats.jsm.streams.delete(streamName("jr", "PODS"));
    const proc = spawnJetroute("pod-watcher", ["pod-watcher", "--static", file, "--probe-timeout-ms", "1500", "--leader-election", "--lease-ms", "30000", "--watcher-id", "sig-one", "--heartbeat-ms", "200", "--nats", env.server.url]);
    try {
      let holder: string | undefined;
      await waitFor(async () => (holder = (await store.read())?.holder) === "sig-one", 10_000, () => `sig-one to hold the lease (holder: ${holder})`, 50);
      expect(holder).toBe("sig-one");
      await proc.stop(10_000);
      // Released on the way out: the standby need not wait out a 30 s lease.
      expect((await store.read())?.holder).toBe("");
    } finally {
      await proc.kill().catch(() => undefined);
      mute.close();
      await applyStreams(env.nats.nc, env.nats.jsm);
    }
  });
});
