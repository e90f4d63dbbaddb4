/**
 * The gateways the front talks to, round-robin, skipping one that refuses connections the way
 * Envoy's load balancing skips an ext_proc endpoint that fails to connect.
 */
import * as grpc from "@grpc/grpc-js";
import {
  ExtProcClient,
  type ExtProcClientOptions,
  type ExtProcExchange,
  ExtProcStreamError,
  type HeaderInput,
  type OpenOptions,
  type PhaseResult,
} from "../extproc/envoy-client.js";

export interface OpenedExchange {
  exchange: ExtProcExchange;
  /** The reply to the request headers message. */
  first: PhaseResult;
  target: string;
}

export class GatewayPool {
  private readonly clients: ExtProcClient[];
  private next = 0;

  constructor(targets: readonly string[], opts: ExtProcClientOptions = {}) {
    if (targets.length === 0) throw new Error("at least one gateway target is required");
    this.clients = targets.map((t) => new ExtProcClient(t, opts));
  }

  /** Every client, starting at the round-robin position, those known to be failing last. */
  private order(): ExtProcClient[] {
    const start = this.next;
    this.next = (this.next + 1) % this.clients.length;
    const rotated = [...this.clients.slice(start), ...this.clients.slice(0, start)];
    const failing = (c: ExtProcClient) => c.connectivityState() === grpc.connectivityState.TRANSIENT_FAILURE;
    return [...rotated.filter((c) => !failing(c)), ...rotated.filter(failing)];
  }

  /**
   * Opens an exchange and sends the request headers. A gateway that is unreachable (UNAVAILABLE
   * before it answered anything) is skipped; nothing reached it, so trying the next is safe.
   */
  async openWithHeaders(
    headers: HeaderInput,
    endOfStream: boolean,
    open: OpenOptions = {},
    /** Called with each exchange as soon as it exists, so a caller can cancel it mid-flight. */
    onOpen: (exchange: ExtProcExchange) => void = () => {},
  ): Promise<OpenedExchange> {
    let lastError: unknown;
    for (const client of this.order()) {
      const exchange = client.open(open);
      onOpen(exchange);
      try {
        const first = await exchange.requestHeaders(headers, endOfStream);
        return { exchange, first, target: client.target };
      } catch (err) {
        lastError = err;
        if (!(err instanceof ExtProcStreamError && err.code === grpc.status.UNAVAILABLE)) throw err;
      }
    }
    throw lastError;
  }

  close(): void {
    for (const c of this.clients) c.close();
  }
}
