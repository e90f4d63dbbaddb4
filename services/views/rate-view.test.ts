import { describe, expect, it } from "vitest";
import { RateView } from "./rate-view.js";

describe("rate view - fixed windows", () => {
  it("counts a user's requests and tokens per minute and a model's requests per second", () => {
    const r = new RateView();
    r.request("alice", "m", 100, 60_000);
    r.request("alice", "m", 50, 60_500);
    expect(r.modelRequests("m", 60_900)).toBe(2);
    r.completion("alice", 30, 61_000);
    r.request(undefined, "m", 10, 61_200);
    expect(r.userRequests("alice", 61_500)).toBe(2);
    expect(r.userTokens("alice", 61_500)).toBe(180);
    expect(r.modelRequests("m", 61_300)).toBe(1);
    // Next minute: a fresh window.
    expect(r.userRequests("alice", 120_000)).toBe(0);
    r.request("alice", "m", 1, 120_001);
    expect(r.userRequests("alice", 120_002)).toBe(1);
    // A late event from the finished window does not count in the new one.
    r.request("alice", "m", 1, 119_999);
    expect(r.userRequests("alice", 120_002)).toBe(1);
  });

  it("is bounded and sweeps finished windows", () => {
    const r = new RateView(3);
    for (const u of ["a", "b", "c", "d"]) r.request(u, "m", 1, 0);
    expect(r.userRequests("a", 0)).toBe(0);
    expect(r.userRequests("d", 0)).toBe(1);
    r.sweep(120_000);
    expect(r.size).toBe(0);
  });
});

describe("rate view - own admissions not yet seen by other replicas", () => {
  it("remembers own admissions for unconfirmedMs, per user and per model", () => {
    const r = new RateView(100, 25);
    r.noteOwn("alice", "m", 100, 1_000);
    r.noteOwn("alice", "m", 50, 1_010);
    r.noteOwn(undefined, "m", 7, 1_012);
    expect(r.ownRecent("user", "alice", 1_020)).toEqual({ requests: 2, tokens: 150 });
    expect(r.ownRecent("model", "m", 1_020)).toEqual({ requests: 3, tokens: 0 });
    expect(r.ownConfirmedAt("user", "alice", 1_020)).toBe(1_025);
    // The first one is 25 ms old: other replicas have had time to see it.
    expect(r.ownRecent("user", "alice", 1_025)).toEqual({ requests: 1, tokens: 50 });
    expect(r.ownRecent("user", "alice", 1_040)).toEqual({ requests: 0, tokens: 0 });
    expect(r.ownConfirmedAt("user", "alice", 1_040)).toBe(1_040);
  });

  it("a retracted charge (lost strict race) neither counts nor is reserved for", () => {
    const r = new RateView(100, 25);
    r.request("alice", "m", 10, 5_000);
    r.noteOwn("alice", "m", 10, 5_000);
    r.retract("alice", "m", 10, 5_000, { user: "alice", model: "m", tokens: 10, ts: 5_000 });
    expect(r.userRequests("alice", 5_001)).toBe(0);
    expect(r.userTokens("alice", 5_001)).toBe(0);
    expect(r.modelRequests("m", 5_001)).toBe(0);
    expect(r.ownRecent("user", "alice", 5_001).requests).toBe(0);
  });

  it("keeps only the last unconfirmedMs of own admissions under continuous traffic, read or not", () => {
    const r = new RateView(100, 25);
    for (let t = 0; t < 10_000; t++) r.noteOwn("alice", "m", 1, t); // 1 per ms for 10 s, never read
    // The list holds what was admitted in the last 25 ms, not 10 000 entries.
    expect(r.ownRecent("user", "alice", 9_999).requests).toBe(25);
    r.noteOwn(undefined, undefined, 1, 10_000); // nothing limited: nothing recorded
    expect(r.size).toBe(2);
  });

  it("a strict charge acknowledged late counts as unseen from its ack, even after its entry aged out", () => {
    const r = new RateView(100, 25);
    r.noteOwn("alice", "m", 10, 1_000);
    r.noteOwn("alice", "m", 10, 1_000); // two in the same millisecond
    expect(r.ownRecent("user", "alice", 1_030).requests).toBe(0); // aged out before the ack
    r.renoteOwn("alice", "m", 10, 1_000, 1_040); // acknowledged at 1 040
    expect(r.ownRecent("user", "alice", 1_050)).toEqual({ requests: 1, tokens: 10 });
    expect(r.ownRecent("model", "m", 1_050).requests).toBe(1);
    expect(r.ownRecent("user", "alice", 1_066).requests).toBe(0);
  });

  it("a published admission stays unseen until its charge is read back, then unconfirmedMs more; a lost echo stops counting at maxUnseenMs", () => {
    const r = new RateView(100, 25);
    expect(r.maxUnseenMs).toBe(1_000);
    r.noteOwn("alice", "m", 10, 1_000, "c-1");
    r.noteOwn("alice", undefined, 5, 1_002, "c-2");
    expect(r.awaitingEcho).toBe(2);
    // A loaded host: 300 ms later neither echo has come, so both may still be unseen elsewhere.
    expect(r.ownRecent("user", "alice", 1_300)).toEqual({ requests: 2, tokens: 15 });
    expect(r.ownRecent("model", "m", 1_300).requests).toBe(1);
    // Waiting for an echo: asked again after a short poll, not after 25 ms from the admission.
    expect(r.ownConfirmedAt("user", "alice", 1_300)).toBe(1_305);
    r.echoOwn("c-1", 1_300);
    r.echoOwn("unknown", 1_300); // another replica's id, or one already read: nothing
    expect(r.awaitingEcho).toBe(1);
    // c-1 was read back at 1 300: the other replicas read it about as late, so it counts 25 ms more.
    expect(r.ownRecent("user", "alice", 1_310)).toEqual({ requests: 2, tokens: 15 });
    expect(r.ownConfirmedAt("model", "m", 1_310)).toBe(1_325);
    expect(r.ownRecent("user", "alice", 1_325)).toEqual({ requests: 1, tokens: 5 });
    expect(r.ownRecent("model", "m", 1_325).requests).toBe(0);
    // Read back at once: still unseen for unconfirmedMs after the echo.
    r.noteOwn("alice", undefined, 1, 1_400, "c-3");
    r.echoOwn("c-3", 1_401);
    expect(r.ownRecent("user", "alice", 1_410)).toEqual({ requests: 2, tokens: 6 });
    expect(r.ownConfirmedAt("user", "alice", 1_410)).toBe(1_410 + 5); // c-2 polls first
    expect(r.ownRecent("user", "alice", 1_426)).toEqual({ requests: 1, tokens: 5 });
    // c-2's echo never comes (its publish was lost): it stops counting 1 s after its admission.
    expect(r.ownRecent("user", "alice", 2_001).requests).toBe(1);
    expect(r.ownRecent("user", "alice", 2_002).requests).toBe(0);
    r.sweep(2_100);
    expect(r.awaitingEcho).toBe(0);
    expect(r.size).toBe(0);
  });

  it("with --rate-confirm-ms 0 nothing is reserved, echo or not", () => {
    const r = new RateView(100, 0);
    r.noteOwn("alice", "m", 10, 1_000, "c-1");
    expect(r.ownRecent("user", "alice", 1_000).requests).toBe(0);
  });

  it("sweeps own admissions once they are old, and bounds their keys", () => {
    const r = new RateView(2, 25);
    r.noteOwn("a", "m", 1, 0);
    r.noteOwn("b", "m", 1, 0);
    expect(r.ownRecent("user", "a", 1).requests).toBe(0); // evicted by b's and m's keys
    r.sweep(100);
    expect(r.size).toBe(0);
  });
});

describe("rate view - prompt estimates replaced by the engine's count", () => {
  it("corrects the user's tokens in the window the request was charged in", () => {
    const r = new RateView();
    r.request("alice", "m", 10, 60_000); // estimated 10
    r.correctPrompt("alice", 90, 60_000); // the engine counted 100
    expect(r.userTokens("alice", 61_000)).toBe(100);
    r.correctPrompt("alice", -500, 60_000); // an over-estimate never drives the count below 0
    expect(r.userTokens("alice", 61_000)).toBe(0);
  });

  it("leaves a window that is over alone, and counts requests without a user apart from every named user", () => {
    const r = new RateView();
    r.request("alice", "m", 10, 60_000);
    r.request("alice", "m", 10, 120_500); // a new minute
    r.correctPrompt("alice", 50, 60_000); // belongs to the finished minute
    expect(r.userTokens("alice", 121_000)).toBe(10);
    r.correctPrompt(undefined, 50, 120_500);
    expect(r.userTokens("alice", 121_000)).toBe(10);
  });
});
