/**
 * The ZMQ side of one pod: a SUB on the engine's live PUB and a DEALER on its replay ROUTER.
 *
 * libzmq reconnects both sockets by itself (with exponential backoff up to
 * `reconnectMaxIntervalMs`) when an engine goes away and comes back. One case it does not recover
 * from: a peer that violates `maxMessageSize` gets its session terminated for good (a protocol
 * error, not a connection error), so the SUB would stay silent forever. The link notices a
 * disconnect that is not followed by a reconnect attempt and recreates the socket.
 */
import { Dealer, Subscriber } from "zeromq";
import type { Logger } from "../shared/log.js";
import { type Frame, parseReplayMessage, type Result, seqFrame } from "./wire.js";

export interface EngineLinkOptions {
  endpoint: string;
  replayEndpoint?: string;
  topic?: string;
  /** libzmq's hard inbound limit (ZMQ_MAXMSGSIZE); larger messages cost the connection. */
  maxMessageBytes: number;
  reconnectIntervalMs: number;
  reconnectMaxIntervalMs: number;
  log: Logger;
  counters: LinkCounters;
  /** A live message, frames as received. */
  onMessage(frames: Buffer[]): void;
  /** The SUB is connected again after losing its connection: live messages may have been missed. */
  onReconnect(): void;
  /** The SUB's ZMTP handshake with the engine completed (first connect and every reconnect). */
  onJoined?(): void;
}

export interface ReplayReply {
  frames: Buffer[];
  parsed: Result<Frame>;
}

export type ReplayOutcome = { ok: true; replies: ReplayReply[] } | { ok: false; reason: string };

export interface LinkCounters {
  disconnects: number;
  socketsRecreated: number;
}

/** A disconnect with no reconnect attempt within this long means libzmq gave the session up. */
const DEAD_SESSION_MS = 300;

export class EngineLink {
  private sub?: Subscriber;
  private dealer?: Dealer;
  private closed = false;
  private paused?: { promise: Promise<void>; resolve: () => void };
  private readerDone?: Promise<void>;
  /**
   * The SUB socket's ZMTP session with the engine is up (handshake done, no disconnect since). Its
   * subscription reaches the engine a moment later: PUB/SUB has no "subscribed" signal, so what
   * the engine publishes meanwhile is missed (the pod bridge's post-join replay fetches it).
   */
  connected = false;

  constructor(private readonly o: EngineLinkOptions) {}

  get hasReplay(): boolean {
    return !!this.o.replayEndpoint;
  }

  start(): void {
    this.readerDone = this.readLoop();
    // Connect the DEALER early so the first replay does not wait for the TCP handshake.
    if (this.o.replayEndpoint) {
      try {
        this.dealer = this.newDealer();
      } catch {
        /* reported by the first replay */
      }
    }
  }

  /** Backpressure: stop taking live messages off the socket (libzmq queues, then the PUB drops). */
  pause(): void {
    if (this.paused) return;
    let resolve!: () => void;
    const promise = new Promise<void>((r) => (resolve = r));
    this.paused = { promise, resolve };
  }

  resume(): void {
    const p = this.paused;
    this.paused = undefined;
    p?.resolve();
  }

  private newSub(): Subscriber {
    const sub = new Subscriber({
      linger: 0,
      maxMessageSize: this.o.maxMessageBytes,
      reconnectInterval: this.o.reconnectIntervalMs,
      reconnectMaxInterval: this.o.reconnectMaxIntervalMs,
      receiveHighWaterMark: 100_000,
    });
    let lostAt = 0;
    let retried = false;
    let timer: NodeJS.Timeout | undefined;
    sub.events.on("handshake", () => {
      if (this.sub !== sub) return;
      this.connected = true;
      this.o.onJoined?.();
    });
    sub.events.on("disconnect", () => {
      if (this.sub === sub) this.connected = false;
      this.o.counters.disconnects++;
      lostAt = Date.now();
      retried = false;
      clearTimeout(timer);
      timer = setTimeout(() => {
        if (retried || this.closed || sub.closed) return;
        this.o.log.warn({ endpoint: this.o.endpoint }, "engine session terminated (oversized message?); recreating the SUB socket");
        this.o.counters.socketsRecreated++;
        sub.close();
      }, DEAD_SESSION_MS);
      timer.unref();
    });
    const attempt = () => {
      retried = true;
    };
    sub.events.on("connect:retry", attempt);
    sub.events.on("connect:delay", attempt);
    sub.events.on("connect", () => {
      retried = true;
      if (lostAt) {
        lostAt = 0;
        this.o.onReconnect();
      }
    });
    sub.connect(this.o.endpoint);
    sub.subscribe(this.o.topic ?? "");
    return sub;
  }

  private async readLoop(): Promise<void> {
    let recreated = false;
    while (!this.closed) {
      let sub: Subscriber;
      try {
        this.connected = false;
        sub = this.sub = this.newSub();
      } catch (err) {
        // Only a malformed endpoint gets here; a new PODS event for the pod replaces this link.
        this.o.log.error({ err, endpoint: this.o.endpoint }, "cannot connect to the engine's KV event endpoint");
        return;
      }
      // A recreated socket starts with nothing: whatever the engine sent meanwhile is a gap.
      if (recreated) this.o.onReconnect();
      try {
        for await (const frames of sub) {
          this.o.onMessage(frames);
          if (this.paused) await this.paused.promise;
          if (this.closed) break;
        }
      } catch (err) {
        if (!this.closed && !sub.closed) this.o.log.warn({ err, endpoint: this.o.endpoint }, "SUB receive failed; recreating");
      }
      if (!sub.closed) sub.close();
      recreated = true;
    }
  }

  private newDealer(): Dealer {
    const d = new Dealer({
      linger: 0,
      maxMessageSize: this.o.maxMessageBytes,
      reconnectInterval: this.o.reconnectIntervalMs,
      reconnectMaxInterval: this.o.reconnectMaxIntervalMs,
    });
    d.connect(this.o.replayEndpoint as string);
    return d;
  }

  /**
   * Asks the engine for every buffered batch with seq >= `from` and collects the replies up to the
   * end marker. `idleTimeoutMs` bounds the wait for each reply. After any failure the DEALER is
   * replaced, so late replies to an abandoned request can never be mistaken for the next one's.
   */
  async replay(from: number, idleTimeoutMs: number): Promise<ReplayOutcome> {
    if (!this.o.replayEndpoint) return { ok: false, reason: "no replay endpoint" };
    if (this.closed) return { ok: false, reason: "closed" };
    let d: Dealer;
    try {
      d = this.dealer ??= this.newDealer();
    } catch (err) {
      return { ok: false, reason: `cannot connect to the replay endpoint: ${(err as Error).message}` };
    }
    d.sendTimeout = idleTimeoutMs;
    d.receiveTimeout = idleTimeoutMs;
    const replies: ReplayReply[] = [];
    try {
      await d.send([Buffer.alloc(0), seqFrame(from)]);
      for (;;) {
        const frames = await d.receive();
        const r = parseReplayMessage(frames);
        if (r.ok && r.value === "end") return { ok: true, replies };
        replies.push({ frames, parsed: r as Result<Frame> });
      }
    } catch (err) {
      if (this.dealer === d) this.dealer = undefined;
      d.close();
      const code = (err as { code?: string }).code;
      return { ok: false, reason: code === "EAGAIN" ? `replay timed out after ${idleTimeoutMs} ms` : `replay failed: ${(err as Error).message}` };
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.resume();
    this.sub?.close();
    this.dealer?.close();
    this.dealer = undefined;
    await this.readerDone;
  }
}
