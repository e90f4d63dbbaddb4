/**
 * Keeps ext_proc connections clear of Node's HTTP/2 rapid-reset guard.
 *
 * nghttp2's CVE-2023-44487 fix (in Node since 18.18.2 / 20.8.1) gives every server connection a
 * token bucket: 1000 tokens, 33 back per whole second, one taken by each RST_STREAM received —
 * whatever its error code, even for a stream that is already closed. When it is empty nghttp2 sends
 * GOAWAY(INTERNAL_ERROR) by itself: the connection takes no new streams and the client must
 * reconnect. Node may never close that session: it stops reading once nghttp2 wants nothing more,
 * so the socket can stay in CLOSE_WAIT after the client hangs up.
 *
 * Envoy ends every ext_proc stream with a half-close and an immediate RST_STREAM unless the runtime
 * guard `envoy.reloadable_features.ext_proc_graceful_grpc_close` is on (1.34+, off by default), so
 * an Envoy connection carrying more than 33 requests per second is cut after about a thousand.
 * Node 20 cannot tune the bucket (`streamResetBurst` / `streamResetRate` arrived in 22.10 / 23.0)
 * and grpc-js passes no such option to `http2.createServer`.
 *
 * So each connection keeps a copy of the bucket here. A stream that ends in a reset the server can
 * see takes a token: reset before the server finished its side (Node's `aborted` — how Envoy's
 * half-close + RST_STREAM(NO_ERROR) reaches the gateway, which ends its side a turn later) or closed
 * with a non-zero RST_STREAM code. A reset landing after the server has ended its side reaches no
 * JavaScript event, yet nghttp2 counts it; so once an eighth of a connection's streams ended in a
 * visible reset, every stream on it takes a token (a client that resets, resets them all; a
 * graceful one only cancels the odd request). Tokens come back per whole second elapsed, never
 * faster than nghttp2's. Before the copy runs low the connection is closed gracefully (GOAWAY
 * NO_ERROR: streams in flight finish, new ones go to a new connection); nghttp2 stops counting once
 * a GOAWAY is submitted. Connections whose streams end cleanly are never rotated.
 *
 * Not covered: a client whose resets all land after the server's trailers (half-close, wait for the
 * status, then reset). Envoy does not do that; `max_requests_per_connection` on Envoy's ext_proc
 * cluster covers any client (deploy/README.md).
 */
import http2 from "node:http2";
import type * as grpc from "@grpc/grpc-js";

const { NGHTTP2_NO_ERROR } = http2.constants;

/** nghttp2's defaults (NGHTTP2_DEFAULT_STREAM_RESET_BURST / _RATE), not configurable in Node 20. */
export const STREAM_RESET_BURST = 1000;
export const STREAM_RESET_RATE_PER_S = 33;

export interface ResetBudgetOptions {
  /**
   * Tokens left when the connection is rotated: headroom for resets nghttp2 counts that the
   * server never sees (resets of already-closed streams) and for streams reset before the GOAWAY
   * goes out. Default 100.
   */
  reserve?: number;
  /** Called once per rotated connection with the streams it carried and the resets seen on it. */
  onRotate?: (streams: number, resets: number) => void;
  now?: () => number;
}

/** Live counters of the ext_proc server's HTTP/2 connections. */
export interface ExtProcConnectionStats {
  /** Connections currently open (including ones draining after a rotation). */
  open: number;
  /** Connections accepted since start. */
  opened: number;
  /** Connections closed gracefully here before nghttp2's reset guard could drop them. */
  rotated: number;
  /** Streams seen ending in a reset, since start. */
  resets: number;
}

/**
 * Installs the per-connection budget on every HTTP/2 server of a bound grpc-js server. Call it
 * right after `bindAsync` has completed. Returns undefined when grpc-js no longer exposes its HTTP/2
 * servers the way 1.10–1.14 do (the private `http2Servers` map); the caller should log that.
 */
export function guardResetBudget(server: grpc.Server, opts: ResetBudgetOptions = {}): ExtProcConnectionStats | undefined {
  const servers = (server as unknown as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map) || servers.size === 0) return undefined;
  const reserve = opts.reserve ?? 100;
  const now = opts.now ?? (() => performance.now());
  const stats: ExtProcConnectionStats = { open: 0, opened: 0, rotated: 0, resets: 0 };
  for (const h2 of servers.keys() as IterableIterator<http2.Http2Server>) {
    h2.on("session", (session: http2.ServerHttp2Session) => {
      stats.open++;
      stats.opened++;
      session.once("close", () => stats.open--);
      let tokens = STREAM_RESET_BURST;
      let refilledAt = now();
      let streams = 0;
      let closed = 0;
      let resets = 0;
      let rotating = false;
      const take = () => {
        const t = now();
        const seconds = Math.floor((t - refilledAt) / 1000);
        if (seconds > 0) {
          tokens = Math.min(STREAM_RESET_BURST, tokens + seconds * STREAM_RESET_RATE_PER_S);
          refilledAt += seconds * 1000;
        }
        tokens--;
        if (tokens > reserve || rotating) return;
        rotating = true;
        // After the reads in progress: the GOAWAY's last stream id then covers every stream accepted.
        setImmediate(() => {
          if (session.closed || session.destroyed) return;
          stats.rotated++;
          opts.onRotate?.(streams, resets);
          session.close();
        });
      };
      session.on("stream", (stream: http2.ServerHttp2Stream) => {
        streams++;
        stream.once("close", () => {
          closed++;
          const reset = stream.aborted || stream.rstCode !== NGHTTP2_NO_ERROR;
          if (reset) {
            resets++;
            stats.resets++;
          }
          if (reset || resets * 8 >= closed) take();
        });
      });
    });
  }
  return stats;
}
