/**
 * The flow bench's client: one streamed chat request through the front, its outcome as the
 * operator sees it (served, expired in the waiting room, dropped, cancelled, failed) and when its
 * first token arrived.
 */
import http from "node:http";
import { chunkContent, drainSseData } from "../streams-read.js";
import type { FlowRequest } from "../workloads/flow-mix.js";


export type OutcomeKind = "ok" | "expired" | "dropped" | "cancelled" | "error";

export interface ClientOutcome {
  kind: OutcomeKind;
  /** HTTP status; 0 when none arrived. */
  status: number;
  code?: string;
  /** ms since the run's t0 (performance clock). */
  sentAt: number;
  firstTokenAt?: number;
  endAt: number;
  error?: string;
}

export interface LiveRequest {
  r: FlowRequest;
  done: Promise<ClientOutcome>;
  cancel(): void;
}

/**
 * One chat completion through the front. Interactive requests stream and their first token is the
 * first SSE event whose delta carries text (vLLM opens with an empty assistant delta); batch
 * requests take the whole JSON answer. A non-200 answer is classified by its OpenAI error code.
 */
export function sendChat(agent: http.Agent, port: number, model: string, r: FlowRequest, id: string, now: () => number, timeoutMs: number): LiveRequest {
  const stream = r.objective === "interactive";
  const body = JSON.stringify({ model, messages: [{ role: "user", content: r.prompt }], max_tokens: r.maxTokens, stream });
  const sentAt = now();
  let req: http.ClientRequest | undefined;
  let cancelled = false;
  let finish: (o: Omit<ClientOutcome, "sentAt" | "endAt">) => void = () => {};
  const done = new Promise<ClientOutcome>((resolve) => {
    let settled = false;
    let firstTokenAt: number | undefined;
    finish = (o) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ ...o, ...(firstTokenAt !== undefined && o.firstTokenAt === undefined ? { firstTokenAt } : {}), sentAt, endAt: now() });
    };
    const fail = (status: number, error: string) => finish(cancelled ? { kind: "cancelled", status } : { kind: "error", status, error });
    req = http.request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/v1/chat/completions",
        agent,
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
          "x-request-id": id,
          user: r.user,
          "x-jetroute-objective": r.objective,
        },
      },
      (res) => {
        res.setEncoding("utf8");
        const status = res.statusCode ?? 0;
        let text = "";
        let sawDone = false;
        let buf = "";
        res.on("data", (c: string) => {
          if (!stream || status !== 200) {
            if (text.length < 1_000_000) text += c;
            return;
          }
          buf = drainSseData(buf + c, (data) => {
            if (data === "[DONE]") sawDone = true;
            else if (firstTokenAt === undefined && chunkContent(data) !== undefined) firstTokenAt = now();
          });
        });
        res.on("end", () => {
          if (status !== 200) {
            let code: string | undefined;
            try {
              const c = (JSON.parse(text) as { error?: { code?: unknown } }).error?.code;
              if (c !== undefined) code = String(c);
            } catch {
              /* not an OpenAI error body */
            }
            const kind: OutcomeKind = status === 429 && code === "queue_timeout" ? "expired" : status === 429 && code === "queue_full" ? "dropped" : "error";
            finish({ kind, status, ...(code ? { code } : {}), ...(kind === "error" ? { error: `HTTP ${status}: ${text.slice(0, 300)}` } : {}) });
          } else if (stream) {
            if (sawDone && firstTokenAt !== undefined) finish({ kind: "ok", status });
            else fail(status, sawDone ? "stream carried no content" : "stream ended without [DONE]");
          } else {
            let ok = false;
            try {
              ok = typeof (JSON.parse(text) as { choices?: Array<{ message?: { content?: unknown } }> }).choices?.[0]?.message?.content === "string";
            } catch {
              /* truncated */
            }
            if (ok) finish({ kind: "ok", status });
            else fail(status, "answer is not a chat completion");
          }
        });
        res.on("error", (err) => fail(status, `response: ${err.message}`));
        res.on("close", () => {
          if (!res.complete) fail(status, "response closed before its end");
        });
      },
    );
    const timer = setTimeout(() => {
      req?.destroy();
      fail(0, `no complete answer within ${timeoutMs} ms`);
    }, timeoutMs);
    req.on("error", (err) => fail(0, `request: ${err.message}`));
    req.end(body);
  });
  return {
    r,
    done,
    cancel() {
      cancelled = true;
      req?.destroy();
      finish({ kind: "cancelled", status: 0 });
    },
  };
}

