import { writeFileSync, mkdtempSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { streamName } from "../../streams/definitions.js";
import { MODEL, quietLog, startTestEnv, type TestEnv, waitFor } from "../../test/harness/env.js";
import { StreamFollower } from "../shared/follower.js";
import { PodSet } from "../views/pod-set.js";
import { parsePodList, PodListError } from "./static-pods.js";
import { startPodWatcher } from "./pod-watcher.js";

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
    ["- {name: a, model: m, address: 'h:1'}\n- {name: a, model: m, address: 'h:2'}", /duplicate pod "a"/],
    ["- [unclosed", /not valid YAML/],
  ])("rejects %j naming the problem", (text, msg) => {
    expect(() => parsePodList(text, "pods.yaml")).toThrow(PodListError);
    expect(() => parsePodList(text, "pods.yaml")).toThrow(msg);
  });
});

describe("pod-watcher - publishes readiness to PODS", () => {
  let env: TestEnv;
  let healthy = true;
  let engine: http.Server;
  let enginePort = 0;
  const view = new PodSet();
  let follower: StreamFollower<"pod">;
  beforeAll(async () => {
    env = await startTestEnv();
    engine = http.createServer((_req, res) => {
      res.writeHead(healthy ? 200 : 503);
      res.end();
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    enginePort = (engine.address() as { port: number }).port;
    follower = new StreamFollower({
      nats: env.nats, subjects: env.subjects, log: quietLog, name: "test", family: "pods", types: ["pod"] as const,
      stream: streamName("jr", "PODS"), filter: env.subjects.all("pods"), startAt: { kind: "all" }, onEvent: (ev) => view.apply(ev),
    });
    await follower.start();
  });
  afterAll(async () => {
    await follower?.stop();
    engine?.close();
    await env?.stop();
  });

  it("publishes probe results, follows health changes, and removes pods that leave the list", async () => {
    // A pod published by an earlier run that is no longer listed must be removed at start.
    await env.publishPod({ pod: "ghost", address: "127.0.0.1:1" });
    await waitFor(() => view.get(MODEL, "ghost") !== undefined, 2_000, "ghost pod");

    const dir = mkdtempSync(path.join(os.tmpdir(), "jr-pw-"));
    const file = path.join(dir, "pods.yaml");
    const listed = (names: string[]) =>
      writeFileSync(file, `pods:\n${names.map((n) => `  - {name: ${n}, model: ${MODEL}, address: '127.0.0.1:${n === "dead" ? 1 : enginePort}'}`).join("\n")}\n`);
    listed(["live.0", "dead"]);
    const w = await startPodWatcher({ nats: env.server.url, file, probeIntervalMs: 100, probeTimeoutMs: 300, log: quietLog });
    try {
      await w.firstRound;
      await waitFor(() => view.get(MODEL, "live.0")?.ready === true && view.get(MODEL, "dead")?.ready === false, 3_000, "first round");
      await waitFor(() => view.get(MODEL, "ghost") === undefined, 2_000, "ghost removed");

      healthy = false;
      await waitFor(() => view.get(MODEL, "live.0")?.ready === false, 3_000, "pod turning unready");
      healthy = true;
      await waitFor(() => view.get(MODEL, "live.0")?.ready === true, 3_000, "pod ready again");

      listed(["live.0"]);
      await waitFor(() => view.get(MODEL, "dead") === undefined, 5_000, "removal after the list changed");
      expect(view.readyPods(MODEL).map((p) => p.pod)).toEqual(["live.0"]);
    } finally {
      await w.close();
    }
  });
});
