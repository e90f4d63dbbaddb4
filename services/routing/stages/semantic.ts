/**
 * The semantic stage (docs/semantic.md): for a request whose `model` is a virtual model, its
 * signals are measured, every decision's rule is evaluated over them, and the winning decision's
 * action rewrites the parsed request — `model`, the system prompt, `chat_template_kwargs` — before
 * the pool check, permissions, limits and scheduling run on the model it chose. Pure and
 * synchronous: embeddings (the only I/O a signal needs) are fetched before, and handed in.
 */
import type { Rule, SemanticAction } from "../../../schemas/semantic.js";
import { RouteError } from "../errors.js";
import type { ParsedRequest } from "../request-body.js";
import type { CompiledRules } from "../semantic/rules.js";
import { measureSignals, type SignalInput, type SignalValue, textsOf } from "../semantic/signals.js";

/** The name a decision record and the response header give the default action. */
export const DEFAULT_DECISION = "default";
/** The response header naming the decision that chose the model. */
export const DECISION_HEADER = "x-jetroute-decision";

export interface DecisionEvaluation {
  decision: string;
  priority: number;
  matched: boolean;
}

/** What the stage decided, and from what (the decision record keeps it; /debug/explain shows it). */
export interface SemanticOutcome {
  virtualModel: string;
  /** The winning decision's name, or `default`. */
  decision: string;
  action: SemanticAction;
  /** The decision that would have won without the winner (another matching decision, else the default). */
  runnerUp?: string;
  signals: Record<string, SignalValue>;
  /** Every decision, in evaluation order (priority, then list order). */
  evaluations: DecisionEvaluation[];
}

/** A rule's value over judged signals (a signal missing from `values` reads false). */
export function evalRule(rule: Rule, values: Readonly<Record<string, { value: boolean } | undefined>>): boolean {
  if (typeof rule === "string") return values[rule]?.value === true;
  if ("all" in rule) return rule.all.every((r) => evalRule(r, values));
  if ("any" in rule) return rule.any.some((r) => evalRule(r, values));
  return !evalRule(rule.not, values);
}

/** The winner and runner-up over judged signals (shared with replay, which judges recorded values). */
export function decide(rules: Pick<CompiledRules, "decisions" | "default">, values: Readonly<Record<string, { value: boolean } | undefined>>): { winner?: { name: string; action: SemanticAction }; runnerUp?: string; evaluations: DecisionEvaluation[] } {
  const evaluations: DecisionEvaluation[] = [];
  const matched: Array<{ name: string; action: SemanticAction }> = [];
  for (const d of rules.decisions) {
    const m = evalRule(d.when, values);
    evaluations.push({ decision: d.name, priority: d.priority, matched: m });
    if (m) matched.push({ name: d.name, action: d.action });
  }
  if (rules.default) matched.push({ name: DEFAULT_DECISION, action: rules.default });
  const [winner, second] = matched;
  return { ...(winner ? { winner } : {}), ...(second ? { runnerUp: second.name } : {}), evaluations };
}

/** The decision a rejected request's record names when no decision matched. */
export const NO_DECISION = "(none)";

/** What a rejection's decision record keeps of a virtual model's classification. */
export type SemanticTag = Pick<SemanticOutcome, "virtualModel" | "decision" | "runnerUp" | "signals">;

/** No decision matched: the refusal, and the classification its rejected record keeps (so replay can re-decide it). */
export interface SemanticRefusal {
  readonly refused: RouteError;
  readonly tag: SemanticTag;
}

/** What the stage reads besides the rules and the parsed body. */
export type ClassifyInput = Omit<SignalInput, "texts" | "promptTokens">;

/** The texts the rules read from this body (bounded; see signals.ts). */
export function requestTexts(rules: CompiledRules, parsed: ParsedRequest): SignalInput["texts"] {
  return textsOf(parsed.body, rules.scopes, rules.maxChars);
}

/**
 * Classifies a request for a virtual model. Throws RouteError `noMatchingDecision` (400) when no
 * decision matches and the virtual model has no default.
 */
export function classify(rules: CompiledRules, parsed: ParsedRequest, input: ClassifyInput, texts = requestTexts(rules, parsed)): SemanticOutcome {
  const j = judge(rules, parsed, input, texts);
  if ("refused" in j) throw j.refused;
  return j;
}

/** `classify`, with a refusal returned together with the classification that led to it. */
export function judge(rules: CompiledRules, parsed: ParsedRequest, input: ClassifyInput, texts = requestTexts(rules, parsed)): SemanticOutcome | SemanticRefusal {
  const signals = measureSignals(rules, { ...input, texts, promptTokens: parsed.promptTokens });
  const { winner, runnerUp, evaluations } = decide(rules, signals);
  if (!winner) {
    const refused = new RouteError("noMatchingDecision", `no decision of the virtual model ${JSON.stringify(rules.model)} matches this request, and it has no default`, "model");
    return { refused, tag: { virtualModel: rules.model, decision: NO_DECISION, signals } };
  }
  return { virtualModel: rules.model, decision: winner.name, action: winner.action, ...(runnerUp ? { runnerUp } : {}), signals, evaluations };
}

/** The system message of an action, as the body carries it. */
function withSystemPrompt(messages: unknown[], sp: NonNullable<SemanticAction["systemPrompt"]>): unknown[] {
  const sys = { role: "system", content: sp.text };
  // "replace": the client's instructions go, whichever role carries them (OpenAI's `developer` is the newer `system`).
  if (sp.mode === "replace") return [sys, ...messages.filter((m) => (m as { role?: unknown }).role !== "system" && (m as { role?: unknown }).role !== "developer")];
  return [sys, ...messages];
}

/**
 * The request as the chosen model gets it: `model` rewritten, the action's system prompt and
 * `chat_template_kwargs` written into the body (chat bodies only; a completion has no messages).
 */
export function applyAction(parsed: ParsedRequest, action: SemanticAction): ParsedRequest {
  const body: Record<string, unknown> = { ...parsed.body, model: action.model };
  let promptTokens = parsed.promptTokens;
  if (action.systemPrompt && (parsed.api === "responses" || parsed.api === "messages")) {
    // The Responses API's `instructions`, the Messages API's `system`: prepended, or in place of the client's.
    const field = parsed.api === "responses" ? "instructions" : "system";
    const own = body[field];
    const ownText = typeof own === "string" ? own : Array.isArray(own) ? own.map((b) => (b as { text?: unknown })?.text ?? "").join("") : "";
    body[field] = action.systemPrompt.mode === "replace" || ownText === "" ? action.systemPrompt.text : `${action.systemPrompt.text}\n\n${ownText}`;
    promptTokens += Math.ceil(action.systemPrompt.text.length / 4);
  } else if (action.systemPrompt && Array.isArray(body.messages)) {
    body.messages = withSystemPrompt(body.messages as unknown[], action.systemPrompt);
    promptTokens += Math.ceil(action.systemPrompt.text.length / 4);
  }
  if (action.chatTemplateKwargs) {
    const prev = body.chat_template_kwargs;
    body.chat_template_kwargs = { ...(prev && typeof prev === "object" && !Array.isArray(prev) ? prev : {}), ...action.chatTemplateKwargs };
  }
  return { ...parsed, model: action.model, promptTokens, body };
}

/** The headers the chosen model's strategy selection reads: the action's profile and strategy win over the client's. */
export function actionHeaders(headers: Readonly<Record<string, string>>, action: SemanticAction): Readonly<Record<string, string>> {
  if (!action.profile && !action.routingStrategy) return headers;
  return { ...headers, ...(action.profile ? { "config-profile": action.profile } : {}), ...(action.routingStrategy ? { "routing-strategy": action.routingStrategy } : {}) };
}
