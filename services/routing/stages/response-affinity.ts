/**
 * The response-affinity stage (docs/stateful-apis.md): a Responses API request's turn (what its
 * reply will be stored with), and for a request naming `previous_response_id` the affinity rule
 * (responses/affinity.ts) applied to the views and the response store:
 * - **pin**: the request may go to the pod holding the previous response only (`subset` = that
 *   pod: recorded, so replay re-decides the same pick);
 * - **expand**: the chain is read from the store and the body rewritten into a self-contained one
 *   (responses/chain.ts), routed by the model's strategy like any request, prefix-aware (the
 *   tokenize stage runs after this one, on the expanded prompt);
 * - **not found**: 404 `response_not_found`, before anything is charged.
 * A client's `request_id` is removed from every Responses body: vLLM takes it as the response id,
 * and a client choosing ids could collide with another tenant's.
 */
import { isResponseId, tenantDigest } from "../../../schemas/responses.js";
import { renderedChars, responsesToChat } from "../../tokenizer/api-messages.js";
import { markRewritten, parsedOf, type RequestContext } from "../context.js";
import { RouteError } from "../errors.js";
import type { PrepareStage, StageEnv } from "../pipeline.js";
import type { ResponseAffinityRecord, ResponseTurn } from "../request.js";
import { type AffinityInput, type AffinityVerdict, responseAffinity } from "../responses/affinity.js";
import { expandedBody, expandInput, inputItems, walkChain } from "../responses/chain.js";

/** The tenant of a request without an authenticated key (`--auth off`): every such request is one tenant. */
export const ANONYMOUS_TENANT = "anonymous";
/** Saturation of a pinned pod when the model has no flow control: llm-d's defaults (flow/settings.ts), on a fresh load sample only. */
const DEFAULT_SATURATION = { queueDepth: 5, kvCacheUsage: 0.8 } as const;

const notFound = (id: string) => new RouteError("responseNotFound", `Response with id '${id.slice(0, 128)}' not found.`, "previous_response_id");

/** Whether the request is a Responses API create (`POST /v1/responses`). */
export function isResponsesCreate(ctx: RequestContext): boolean {
  const parsed = ctx.parsed as { api?: string } | undefined;
  if (parsed?.api !== undefined) return parsed.api === "responses";
  return (ctx.input.headers[":path"] ?? "").split("?")[0] === "/v1/responses";
}

export const responseAffinityStage: PrepareStage = {
  name: "response-affinity",
  phase: "prepare",
  run(ctx, env): void | Promise<void> {
    if (!isResponsesCreate(ctx)) return;
    const parsed = parsedOf(ctx);
    const body = parsed.body as Record<string, unknown>;
    if ("request_id" in body) {
      delete body.request_id;
      markRewritten(ctx);
    }
    const owner = ctx.input.tenant ?? ANONYMOUS_TENANT;
    const prev = body.previous_response_id;
    const instructions = body.instructions;
    const turn: ResponseTurn = {
      owner,
      store: body.store !== false,
      input: inputItems(body.input) ?? [],
      ...(typeof instructions === "string" || Array.isArray(instructions) ? { instructions: instructions as ResponseTurn["instructions"] & object } : {}),
      ...(typeof prev === "string" ? { previousResponseId: prev } : {}),
    };
    ctx.responseTurn = turn;
    if (prev === undefined || prev === null) return;
    if (!isResponseId(prev)) throw notFound(String(prev));
    // Without a store, the engine alone decides (the view still pins to the holder).
    return decide(ctx, env, turn, prev, body);
  },
};

async function decide(ctx: RequestContext, env: StageEnv, turn: ResponseTurn, prev: string, body: Record<string, unknown>): Promise<void> {
  const parsed = parsedOf(ctx);
  const now = env.now();
  const tenant = tenantDigest(turn.owner);
  const held = env.state.responses.get(prev, now);
  const base: Omit<AffinityInput, "ownerState" | "ownerSaturated"> = {
    ...(held ? { location: held } : {}),
    tenant,
    model: parsed.model,
    candidates: candidatesOf(ctx, env, parsed.model),
  };
  let verdict = judge(env, base, now);
  let storedFirst: Awaited<ReturnType<NonNullable<StageEnv["responses"]>["stored"]>>;
  if (verdict.action !== "pin" && env.responses) {
    storedFirst = await env.responses.stored(turn.owner, prev);
    // Not folded yet (another replica recorded it a moment ago): the stored turn names its pod.
    const location = held ?? (storedFirst?.pod !== undefined ? { pod: storedFirst.pod, model: storedFirst.model, tenant, stored: true } : undefined);
    verdict = judge(env, { ...base, ...(location ? { location } : {}), storeHolds: storedFirst !== undefined }, env.now());
  } else if (verdict.action !== "pin") {
    // No store wired: a response this replica does not know is left to the engine (it answers 404 itself).
    return;
  }
  if (verdict.action === "not-found") throw notFound(prev);
  if (verdict.action === "pin") {
    const pod = env.views.pods.get(parsed.model, verdict.pod);
    if (!pod) throw notFound(prev);
    ctx.subset = [pod.address];
    ctx.responseTurn = { ...turn, affinity: { action: "pin", reason: verdict.reason, owner: verdict.pod } };
    return;
  }
  const store = env.responses;
  if (!store) throw notFound(prev);
  const walk = await walkChain(prev, (id) => (id === prev && storedFirst ? Promise.resolve(storedFirst) : store.stored(turn.owner, id)));
  if (!walk.ok) throw notFound(prev);
  const expansion = expandInput(walk.turns, turn.input);
  if (!expansion) throw new RouteError("invalidBody", "the conversation of `previous_response_id` is too long to continue on another pod", "previous_response_id");
  const next = expandedBody(body, expansion);
  parsed.body = next;
  parsed.promptTokens = promptEstimate(next, parsed.promptTokens);
  markRewritten(ctx);
  const affinity: ResponseAffinityRecord = { action: "expand", reason: verdict.reason, ...(verdict.owner !== undefined ? { owner: verdict.owner } : {}), turns: expansion.turns, dropped: expansion.dropped };
  ctx.responseTurn = { ...turn, affinity };
}

/** The request's candidates as select will see them: the model's ready pods within the proxy's subset. */
function candidatesOf(ctx: RequestContext, env: StageEnv, model: string): ReadonlyArray<{ pod: string }> {
  const ready = env.views.pods.readyPods(model);
  if (!ctx.subset) return ready;
  const allowed = new Set(ctx.subset);
  return ready.filter((p) => allowed.has(p.address));
}

/** The affinity rule with the owner pod's state read from the views. */
function judge(env: StageEnv, i: Omit<AffinityInput, "ownerState" | "ownerSaturated">, now: number): AffinityVerdict {
  const loc = i.location;
  const info = loc ? env.views.pods.get(loc.model, loc.pod) : undefined;
  const ownerSaturated = loc !== undefined && info !== undefined && saturated(env, info, now);
  return responseAffinity({ ...i, ...(info ? { ownerState: { ready: info.ready, draining: info.draining !== undefined } } : {}), ownerSaturated });
}

/**
 * Whether the owner pod has no room. A model with flow control: its saturation test, as the flow
 * gate judges it. Otherwise only a fresh load sample can say so (waiting requests or KV usage at
 * llm-d's defaults): without metrics (no scraper, a stale sample) affinity wins, since the
 * owner's cache holds the conversation and failing closed would expand every busy conversation.
 */
function saturated(env: StageEnv, pod: { model: string; pod: string }, now: number): boolean {
  const settings = env.flow.settingsFor(pod.model);
  if (settings) return env.flow.detector.podRoom(pod, settings.saturation, now).full;
  const load = env.views.load.fresh(pod.model, pod.pod, now);
  if (!load) return false;
  return (load.waiting ?? 0) >= DEFAULT_SATURATION.queueDepth || (load.kvCacheUsage ?? 0) >= DEFAULT_SATURATION.kvCacheUsage;
}

/** The parse's estimate (≈ 4 characters per token) of the expanded prompt as the engine renders it. */
function promptEstimate(body: Record<string, unknown>, fallback: number): number {
  try {
    return Math.ceil(renderedChars(responsesToChat(body)) / 4);
  } catch {
    return Math.max(fallback, Math.ceil(JSON.stringify(body.input ?? "").length / 4));
  }
}
