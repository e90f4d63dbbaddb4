import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNats, type NatsHandles } from "../services/shared/nats.js";
import { type NatsServerHandle, startNatsServer } from "../services/shared/nats-server.js";
import { applyStreams } from "./apply.js";
import { streamDefinitions, streamName } from "./definitions.js";
import { Subjects } from "./subjects.js";
import { decodeToken, encodeToken, TokenError } from "./tokens.js";

describe("tokens - reversible escape", () => {
  it.each([
    ["org/Llama-3.1-8B", "org/Llama-3=2E1-8B"],
    ["pod.with.dots", "pod=2Ewith=2Edots"],
    ["a*b>c d", "a=2Ab=3Ec=20d"],
    ["x=y", "x=3Dy"],
    ["plain_name-1", "plain_name-1"],
    ["modèle", "mod=C3=A8le"],
  ])("%s <-> %s", (name, token) => {
    expect(encodeToken(name)).toBe(token);
    expect(decodeToken(token)).toBe(name);
    expect(token).not.toMatch(/[.*>\s]/);
  });
  it("rejects empty names and malformed tokens", () => {
    expect(() => encodeToken("")).toThrow(TokenError);
    expect(() => decodeToken("a=G1")).toThrow(TokenError);
    expect(() => decodeToken("a.b")).toThrow(TokenError);
  });
});

describe("subjects - builders and parser agree", () => {
  const s = new Subjects("jr");
  it("round-trips model and pod through a charge subject", () => {
    const subj = s.charges("org/Llama-3.1-8B", "vllm-0.default");
    expect(subj).toBe("jr.charges.org/Llama-3=2E1-8B.vllm-0=2Edefault");
    expect(s.parse(subj)).toEqual({ family: "charges", names: ["org/Llama-3.1-8B", "vllm-0.default"] });
  });
  it("ignores foreign subjects", () => {
    expect(s.parse("other.charges.a.b")).toBeUndefined();
    expect(s.parse("jr.unknown.a")).toBeUndefined();
  });
});

describe("streams apply - against nats-server 2.9", () => {
  let server: NatsServerHandle;
  let h: NatsHandles;
  beforeAll(async () => {
    server = await startNatsServer();
    h = await connectNats(server.url);
  });
  afterAll(async () => {
    await h?.nc.close();
    await server?.stop();
  });

  it("creates everything once, then reports unchanged, then repairs drift", async () => {
    const first = await applyStreams(h.nc, h.jsm, { prefix: "jr" });
    expect(first.filter((c) => c.action === "created").map((c) => c.name)).toEqual([
      ...streamDefinitions().map((d) => d.config.name),
      "KV_jr-config",
      "KV_jr-leases",
      "OBJ_jr-snapshots",
      "OBJ_jr-files",
    ]);
    const second = await applyStreams(h.nc, h.jsm, { prefix: "jr" });
    expect(second.every((c) => c.action === "unchanged")).toBe(true);

    const name = streamName("jr", "LOAD");
    const info = await h.jsm.streams.info(name);
    await h.jsm.streams.update(name, { ...info.config, max_msgs_per_subject: 99 });
    const third = await applyStreams(h.nc, h.jsm, { prefix: "jr" });
    const load = third.find((c) => c.name === name);
    expect(load?.action).toBe("updated");
    expect(load?.diff).toEqual(["max_msgs_per_subject: 99 -> -1"]);
  });

  it("routes every family's subject into its stream", async () => {
    const s = new Subjects("jr");
    const ack = await h.js.publish(s.heartbeat("gw.1"), "{}");
    expect(ack.stream).toBe(streamName("jr", "CHARGES"));
    const ack2 = await h.js.publish(s.deadLetter("pods"), "x");
    expect(ack2.stream).toBe(streamName("jr", "DLQ"));
  });
});
