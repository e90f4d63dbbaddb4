/**
 * The gateway's followers: one per stream it folds (PODS, LOAD, CHARGES, KV, the base
 * prefix's USAGE and the ADAPTERS placements when they exist), each handing its events to the fold and moving the fold's
 * cursor for every message, applied or not (own echoes, dead letters).
 */
import type { EventType } from "../../schemas/events.js";
import { streamName } from "../../streams/definitions.js";
import { isStreamNotFound } from "../../streams/errors.js";
import { STREAM_EVENT_TYPES } from "../../streams/event-types.js";
import type { Namespace } from "../../streams/pools.js";
import { Subjects } from "../../streams/subjects.js";
import { StreamFollower } from "../shared/follower.js";
import type { Logger } from "../shared/log.js";
import type { NatsHandles } from "../shared/nats.js";
import type { GatewayState, StateStream } from "../views/gateway-state.js";
import type { ServerClock } from "./server-clock.js";
import type { SubjectCursors } from "./subject-cursor.js";
import { RefusedRecordLog } from "./refused-records.js";

export interface GatewayFollowers {
  /** In the order of `views`. */
  readonly followers: ReadonlyArray<StreamFollower<EventType>>;
  /** The view each follower feeds (for metrics and /debug/state). */
  readonly views: readonly string[];
}

function indexOfBytes(hay: Uint8Array, needle: Uint8Array): number {
  return Buffer.from(hay.buffer, hay.byteOffset, hay.byteLength).indexOf(needle);
}

/**
 * The charge id of one of our own events, read from its bytes without parsing it: our events
 * serialize `"id":"<id>",` right before the gateway marker at `marker` (charge ids are generated,
 * never escaped). undefined if the bytes do not have that shape.
 */
export function ownEventId(data: Uint8Array, marker: number): string | undefined {
  const end = marker - 2; // the id's closing quote, before the comma
  if (end < 7 || data[end] !== 0x22 || data[end + 1] !== 0x2c) return undefined;
  let start = end - 1;
  while (start >= 0 && data[start] !== 0x22) start--;
  if (start < 5 || end - start - 1 > 128) return undefined;
  if (Buffer.from(data.buffer, data.byteOffset + start - 5, 5).toString("latin1") !== '"id":') return undefined;
  return Buffer.from(data.buffer, data.byteOffset + start + 1, end - start - 1).toString("latin1");
}

export async function createFollowers(o: {
  nats: NatsHandles;
  ns: Namespace;
  id: string;
  state: GatewayState;
  /** Per-subject cursors of the CHARGES stream (strict mode's compare-and-set). */
  cursors: SubjectCursors;
  serverClock: ServerClock;
  /** The gateway's clock (the one its admissions are stamped with). */
  clock: () => number;
  heartbeatTimeoutMs: number;
  /**
   * The CHARGES follower reads in batches this far apart while charges flow (0 = one delivery per
   * message): every replica folds every other's charges, and a wake-up per message costs ~10x
   * the message's fold. A strict compare-and-set waiting for the view makes it read at once.
   */
  chargesPaceMs?: number;
  /** Start the KV follower right after this sequence (a loaded snapshot's), else at the stream's start. */
  kvAfterSeq?: number;
  log: Logger;
}): Promise<GatewayFollowers> {
  const { nats, ns, id, state, log } = o;
  const prefix = ns.prefix;
  const subjects = new Subjects(prefix);
  // Our events serialize `"gateway":"<id>"` right after `"id"`; this exact byte run marks an echo.
  const ownMarker = new TextEncoder().encode(`"gateway":${JSON.stringify(id)},`);
  const ownHeartbeat = subjects.heartbeat(id);
  // `<prefix>.charges.`: our charges' subjects (releases and heartbeats have their own families).
  const ownCharges = subjects.all("charges").slice(0, -1);
  // PODS events refused for their signature (`--pod-public-key`) are logged on a rate.
  const notes = new RefusedRecordLog(log);
  const seen = (stream: StateStream) => (subject: string, seq: number) => state.skip({ stream, subject, seq, serverTs: 0 });
  const fold = (stream: StateStream) => (ev: Parameters<GatewayState["apply"]>[0], m: { seq: number; subject: string; serverTs: number }) => {
    // PODS too: a lone gateway skips its own CHARGES echoes, and watcher heartbeats come every 5 s.
    if (stream === "charges" || stream === "pods") o.serverClock.observe(m.serverTs);
    notes.note(state.apply(ev, { stream, ...m }));
  };
  const charges = new StreamFollower({
    nats, subjects, log, name: `gateway-${id}-charges`, family: "charges", types: STREAM_EVENT_TYPES.CHARGES,
    // Every live gateway's latest heartbeat lists all the charges it holds, so a few heartbeat
    // periods of history rebuild the whole ledger: boot time does not grow with traffic.
    stream: streamName(prefix, "CHARGES"), startAt: { kind: "time", sinceMs: Date.now() - Math.max(10_000, 3 * o.heartbeatTimeoutMs) },
    paceMs: o.chargesPaceMs ?? 0,
    onEvent: fold("charges"),
    onMessage: (subject, seq, serverTs) => {
      // Our own heartbeat's echo moves the ledger's clock (peers lapse by the stream's time, and a
      // replica whose peers all died reads only its own messages); other echoes are skipped unparsed.
      state.skip({ stream: "charges", subject, seq, serverTs: subject === ownHeartbeat ? serverTs() : 0 });
      o.cursors.seen(subject, seq);
    },
    // Everything we published ourselves was applied when we made it (the fold ignores its own
    // events anyway): recognise the echoes by a byte search and spare them JSON and schema work.
    skipRaw: (data, subject) => {
      const at = ownMarker.length > 0 ? indexOfBytes(data, ownMarker) : -1;
      if (at < 0) return false;
      // The echo of a charge the burst guard is waiting for: its admission has now been read back.
      if (state.rates.awaitingEcho > 0 && subject.startsWith(ownCharges)) {
        const chargeId = ownEventId(data, at);
        if (chargeId !== undefined) state.ownEchoed(chargeId, o.clock());
      }
      return true;
    },
  });
  o.cursors.onWait = () => charges.readNow();
  const followers: Array<StreamFollower<EventType>> = [
    new StreamFollower({
      // The whole stream: pod events and the watcher sources' heartbeats (`podsrc`) in one fold.
      nats, subjects, log, name: `gateway-${id}-pods`, family: "pods", types: STREAM_EVENT_TYPES.PODS,
      stream: streamName(prefix, "PODS"), startAt: { kind: "last-per-subject" },
      onEvent: fold("pods"), onMessage: seen("pods"),
    }),
    new StreamFollower({
      nats, subjects, log, name: `gateway-${id}-load`, family: "load", types: STREAM_EVENT_TYPES.LOAD,
      stream: streamName(prefix, "LOAD"), filter: subjects.all("load"), startAt: { kind: "last-per-subject" },
      onEvent: fold("load"), onMessage: seen("load"),
    }),
    charges,
    new StreamFollower({
      nats, subjects, log, name: `gateway-${id}-kv`, family: "kv", types: STREAM_EVENT_TYPES.KV,
      // No subject filter: the KV stream captures only `<prefix>.kv.>`, and on nats-server 2.9.10 the
      // redundant filter makes catching up a tail several times slower (loadtest/benches/bootstrap.ts).
      stream: streamName(prefix, "KV"), startAt: o.kvAfterSeq !== undefined ? { kind: "sequence", seq: o.kvAfterSeq + 1 } : { kind: "all" },
      onEvent: fold("kv"), onMessage: seen("kv"),
      // Our own routed prefixes were applied when we recorded them.
      skipRaw: (data) => indexOfBytes(data, ownMarker) >= 0,
    }),
  ];

  // Per-user limits across pools: the other namespaces' usage summaries, from the base prefix's
  // stream (the newest per gateway is all a booting gateway needs: each is a whole minute's counts).
  const baseSubjects = new Subjects(ns.configPrefix);
  const usageStream = streamName(ns.configPrefix, "USAGE");
  const ownUsageSubjects = baseSubjects.usageOf(ns.pool);
  const notFound = (err: unknown) => {
    if (isStreamNotFound(err)) return false;
    throw err;
  };
  const hasUsage = await nats.jsm.streams.info(usageStream).then(() => true, notFound);
  if (hasUsage) {
    followers.push(
      new StreamFollower({
        nats, subjects: baseSubjects, log, name: `gateway-${id}-usage`, family: "usage", types: STREAM_EVENT_TYPES.USAGE,
        stream: usageStream, startAt: { kind: "last-per-subject" },
        onEvent: (ev, m) => state.apply(ev, { stream: "usage", ...m }),
        onMessage: (subject, seq) => state.skip({ stream: "usage", subject, seq, serverTs: 0 }),
        // This namespace's summaries (own echoes included) are never counted: skipped by subject, unparsed.
        skipRaw: (_data, subject) => subject.startsWith(ownUsageSubjects),
      }),
    );
  } else log.warn({ stream: usageStream }, "no USAGE stream (run `jetroute streams apply`): per-user rate limits do not count other pools' requests");
  // Managed LoRA adapters (docs/adapters.md): each adapter's last placement says where it is loaded.
  const adaptersStream = streamName(prefix, "ADAPTERS");
  const hasAdapters = await nats.jsm.streams.info(adaptersStream).then(() => true, notFound);
  if (hasAdapters) {
    followers.push(
      new StreamFollower({
        nats, subjects, log, name: `gateway-${id}-adapters`, family: "adapters", types: STREAM_EVENT_TYPES.ADAPTERS,
        stream: adaptersStream, startAt: { kind: "last-per-subject" },
        onEvent: (ev, m) => state.pods.applyPlacement(ev, m.serverTs),
      }),
    );
  } else log.warn({ stream: adaptersStream }, "no ADAPTERS stream (run `jetroute streams apply`): managed LoRA adapters are not routed by their placement");
  // Responses API (docs/stateful-apis.md): where every response lives, from the base prefix's
  // stream (a conversation may cross pools). Its own records too, in the stream's order.
  const responsesStream = streamName(ns.configPrefix, "RESPONSES");
  const hasResponses = await nats.jsm.streams.info(responsesStream).then(() => true, notFound);
  if (hasResponses) {
    followers.push(
      new StreamFollower({
        nats, subjects: baseSubjects, log, name: `gateway-${id}-responses`, family: "resploc", types: STREAM_EVENT_TYPES.RESPONSES,
        // One message per response (a deletion replaces it): the last per subject is the whole view.
        stream: responsesStream, startAt: { kind: "last-per-subject" },
        onEvent: (ev, m) => notes.note(state.apply(ev, { stream: "responses", ...m })),
        onMessage: (subject, seq) => state.skip({ stream: "responses", subject, seq, serverTs: 0 }),
      }),
    );
  } else log.warn({ stream: responsesStream }, "no RESPONSES stream (run `jetroute streams apply`): previous_response_id is not routed to the pod holding the response");
  return { followers, views: ["pods", "load", "charges", "kv", "usage", "adapters", "responses"].filter((v) => (v !== "usage" || hasUsage) && (v !== "adapters" || hasAdapters) && (v !== "responses" || hasResponses)) };
}
