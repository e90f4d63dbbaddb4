/**
 * The paced reader's pure core: reply subjects as nats-server 2.9 writes them (v1, 9 tokens) and
 * the v2 form, and when the next request goes out.
 */
import { describe, expect, it } from "vitest";
import { nextPull, parseDelivery } from "./pull-pacing.js";

describe("parseDelivery", () => {
  it("reads a v1 reply subject (as nats-server 2.9.10 sent it)", () => {
    expect(parseDelivery("$JS.ACK.T.AWVpkZzG.1.5.4.1796281653279476717.0")).toEqual({ seq: 5, dseq: 4, serverTsMs: 1796281653279, pending: 0 });
    expect(parseDelivery("$JS.ACK.JR_CHARGES.c1.1.1200.17.1796281653275799407.42")).toEqual({ seq: 1200, dseq: 17, serverTsMs: 1796281653275, pending: 42 });
  });

  it("reads the v2 form (domain, account hash, and a trailing token)", () => {
    expect(parseDelivery("$JS.ACK.hub.ACCHASH.S.C.2.99.7.1700000000123456789.3.xyz")).toEqual({ seq: 99, dseq: 7, serverTsMs: 1700000000123, pending: 3 });
  });

  it("refuses what is not a JetStream delivery", () => {
    expect(parseDelivery(undefined)).toBeUndefined();
    expect(parseDelivery("")).toBeUndefined();
    expect(parseDelivery("_INBOX.abc")).toBeUndefined();
    expect(parseDelivery("$JS.ACK.S.C.1.2.3")).toBeUndefined();
    expect(parseDelivery("$JS.ACK.S.C.1.x.3.1700000000000000000.0")).toBeUndefined();
  });
});

describe("nextPull", () => {
  const pace = 10;
  it("a filled batch: more are stored, ask again at once", () => {
    expect(nextPull({ wasBatch: true, delivered: 1024, filled: true, sinceSentMs: 1, paceMs: pace })).toEqual({ kind: "batch", delayMs: 0 });
  });
  it("a batch that brought some: ask again paceMs after it was sent", () => {
    expect(nextPull({ wasBatch: true, delivered: 3, filled: false, sinceSentMs: 1, paceMs: pace })).toEqual({ kind: "batch", delayMs: 9 });
    expect(nextPull({ wasBatch: true, delivered: 3, filled: false, sinceSentMs: 25, paceMs: pace })).toEqual({ kind: "batch", delayMs: 0 });
  });
  it("the doorbell rang: traffic starts, the next batch paceMs later (however long the doorbell waited)", () => {
    expect(nextPull({ wasBatch: false, delivered: 1, filled: true, sinceSentMs: 3_000, paceMs: pace })).toEqual({ kind: "batch", delayMs: pace });
  });
  it("an empty batch or an expired doorbell: quiet, leave the doorbell", () => {
    expect(nextPull({ wasBatch: true, delivered: 0, filled: false, sinceSentMs: 1, paceMs: pace })).toEqual({ kind: "doorbell" });
    expect(nextPull({ wasBatch: false, delivered: 0, filled: false, sinceSentMs: 4_000, paceMs: pace })).toEqual({ kind: "doorbell" });
  });
});
