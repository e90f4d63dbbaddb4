/**
 * The flow gate (routing/flow/, docs/flow-control.md): a request for a model with flow control goes
 * on at once when a pod has room and nothing of its band or higher is held, else it is held and
 * goes on when the controller's pump dispatches it (or is answered 429/503 when it expires, is shed
 * or the replica drains). Either way the rest of the path runs synchronously inside the dispatch,
 * so the pump sees each dispatched request's charge before it dispatches the next.
 */
import { RouteError } from "../errors.js";
import type { Held } from "../flow/controller.js";
import { heldBytesOf } from "../flow/held-bytes.js";
import { classify } from "../flow/settings.js";
import type { PlannedContext } from "../context.js";
import type { GateStage, StageEnv } from "../pipeline.js";

export const flowGateStage: GateStage = {
  name: "flow-gate",
  phase: "flow",
  run<T>(ctx: PlannedContext, env: StageEnv, go: () => T | Promise<T>): T | Promise<T> {
    const model = ctx.parsed.model;
    const s = env.flow.settingsFor(model);
    if (!s) return go();
    if (env.lifecycle.closed) throw new RouteError("notReady", "gateway is shutting down");
    const input = ctx.input;
    const cls = classify(s, input.headers, input.keyObjective, input.headers.user || undefined, env.now());
    const record = (waitMs: number) => ({ band: cls.band, ...(cls.objective !== undefined ? { objective: cls.objective } : {}), enqueuedAt: cls.enqueuedAt, waitMs });
    // Scheduled among the pods with room only (the subset is recorded, so replay re-decides the same way).
    // (Not for P/D: its prefill and decode pods are chosen by roles the subset would cut across.)
    const withRoom = (roomy: string[] | undefined) => {
      if (!roomy || ctx.strategy.traits?.disaggregated) return;
      const allowed = input.subset ? roomy.filter((a) => input.subset?.includes(a)) : roomy;
      if (allowed.length > 0) ctx.subset = allowed;
    };
    // What the request retains while held (flow/held-bytes.ts). The body's decoded text was only
    // needed to plan: it is dropped here, so a held request does not keep it.
    // Token ids it keeps: the typed ids (the strategy's, or a completion prompt's own ids copied
    // once at parse), and the ids the parsed body holds as JSON arrays (every list of a batch).
    const promptIds = ctx.parsed.promptTokenIds;
    const heldIds = (ctx.tokens?.length ?? 0) + (promptIds && promptIds !== ctx.tokens ? promptIds.length : 0);
    const bodyIds = ctx.parsed.bodyTokenIds ?? 0;
    const bytes = heldBytesOf({ bodyBytes: input.body.length, ...(ctx.parsed.text !== undefined ? { textChars: ctx.parsed.text.length } : {}), ...(ctx.upstreamBody ? { upstreamBytes: ctx.upstreamBody.length } : {}), ...(heldIds > 0 ? { tokens: heldIds } : {}), ...(bodyIds > 0 ? { bodyTokenIds: bodyIds } : {}) });
    if (ctx.parsed.text !== undefined) ctx.parsed = { ...ctx.parsed, text: undefined };
    let settle: { resolve: (r: T) => void; reject: (e: unknown) => void } | undefined;
    const signal = input.signal;
    let onAbort: (() => void) | undefined;
    const held: Held = {
      model,
      cls,
      dispatch: (waitMs, subset) => {
        if (onAbort) signal?.removeEventListener("abort", onAbort);
        try {
          ctx.flow = record(waitMs);
          withRoom(subset);
          const r = go();
          if (r instanceof Promise) r.then(settle?.resolve, settle?.reject);
          else settle?.resolve(r);
        } catch (err) {
          settle?.reject(err);
        }
      },
      fail: (err) => {
        if (onAbort) signal?.removeEventListener("abort", onAbort);
        settle?.reject(err);
      },
    };
    const offered = env.flow.offer(held, bytes, s);
    if (offered.now) {
      ctx.flow = record(0);
      withRoom(offered.subset);
      return go();
    }
    const id = offered.id as number;
    return new Promise<T>((resolve, reject) => {
      settle = { resolve, reject };
      if (!signal) return;
      onAbort = () => {
        if (env.flow.cancel(model, id)) reject(new RouteError("clientCancelled", "the client went away while the request was held"));
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    });
  },
};
