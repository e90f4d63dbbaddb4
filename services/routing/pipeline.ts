/**
 * The request path's machinery: the kinds of stage, what every stage may read (`StageEnv`), and
 * the driver that runs a `RequestPath` (the list itself is request-path.ts). The driver times
 * every stage and names the stage that refused a request (`RouteError.refusal`); stages know
 * nothing of either.
 *
 * Phases, in order:
 * - prepare: stages that may await (an embedding, a tokenizer call) and refuse early;
 * - flow: the flow gate, which may hold the request and later calls the rest synchronously;
 * - commit: the admit gate (it may hold a request for the burst guard) whose last verdict runs the
 *   commit section in the same synchronous call. The section's stages return `undefined`: an
 *   async function cannot implement one, so nothing can await between reading the ledger
 *   (select) and charging it (charge). A committer (stages/commit.ts) decides how the charge is
 *   shared, through a `CommitPort`;
 * - after: stages on the routed request (a P/D prefill leg).
 */
import type { ConfigReader } from "../views/model-config.js";
import type { GatewayState } from "../views/gateway-state.js";
import type { PlannedContext, RequestContext, CommitMode } from "./context.js";
import { contextOf, isPlanned } from "./context.js";
import { semanticRecordOf } from "./decision-inputs.js";
import { RouteError } from "./errors.js";
import type { FlowController } from "./flow/controller.js";
import type { RequestLifecycle } from "./lifecycle.js";
import type { EmbeddingSource, EventSink, GatewayViews, ModelRewrites, PoolIdentity, PrefixSupport, ResponseState } from "./ports.js";
import type { RoutedRequest, RouteInput } from "./request.js";
import type { Admission } from "./stages/admission.js";
import type { PdCoordinator } from "./stages/pd-coordinator.js";
import type { PdLegs } from "./stages/pd-legs.js";
import { isLargeBody, shouldYieldTurn, type TurnSlicing } from "./turn-budget.js";


export type Phase = "prepare" | "flow" | "commit" | "after";

/** Everything a stage may read: views, configuration and the core's parts. */
export interface StageEnv {
  readonly gatewayId: string;
  readonly defaultStrategy: string;
  readonly chargeTtlMs: number;
  /** The fold the views are read from and this replica's own events are applied to. */
  readonly state: GatewayState;
  readonly views: GatewayViews;
  readonly sink: EventSink;
  readonly now: () => number;
  /** The broker's time (peers' liveness is read on it). */
  readonly serverNow?: () => number;
  readonly config?: ConfigReader;
  readonly pool?: PoolIdentity;
  readonly prefix?: PrefixSupport;
  readonly embeddings?: EmbeddingSource;
  readonly modelRewrites?: ModelRewrites;
  /** The Responses API's response store (absent: `previous_response_id` is left to the engine). */
  readonly responses?: ResponseState;
  readonly admission: Admission;
  readonly flow: FlowController;
  readonly pd: PdCoordinator;
  readonly legs?: PdLegs;
  readonly lifecycle: RequestLifecycle;
  readonly consistency?: "eventual" | "strict" | "off";
  readonly recordPromptBlocks: boolean;
  readonly onPick?: (strategy: string, seconds: number) => void;
  /**
   * Slicing of a large request's work into short turns of the event loop (turn-budget.ts): where
   * the driver may let other requests run between stages. Absent: stages run back to back.
   */
  readonly turns?: TurnSlicing;
}

export interface PrepareStage {
  readonly name: string;
  readonly phase: "prepare";
  run(ctx: RequestContext, env: StageEnv): void | Promise<void>;
}

/** The flow gate: calls `proceed` (the commit and after phases) now, or later when a held request is dispatched. */
export interface GateStage {
  readonly name: string;
  readonly phase: "flow";
  run<T>(ctx: PlannedContext, env: StageEnv, proceed: () => T | Promise<T>): T | Promise<T>;
}

/** The commit section's entry: calls `section` in the same synchronous step as its last verdict. */
export interface AdmitStage {
  readonly name: string;
  readonly phase: "commit";
  run<T>(ctx: PlannedContext, env: StageEnv, section: () => T): T | Promise<T>;
}

/** A stage of the commit section: synchronous by type (it returns `undefined`, which a promise is not). */
export interface SectionStage {
  readonly name: string;
  readonly phase: "commit";
  run(ctx: PlannedContext, env: StageEnv): undefined;
}

export interface AfterStage {
  readonly name: string;
  readonly phase: "after";
  run(r: RoutedRequest, ctx: PlannedContext, env: StageEnv): RoutedRequest | Promise<RoutedRequest>;
}

export interface RequestPath {
  readonly prepare: readonly PrepareStage[];
  readonly gate: GateStage;
  readonly admit: AdmitStage;
  readonly section: readonly SectionStage[];
  readonly after: readonly AfterStage[];
}

export type AnyStage = PrepareStage | GateStage | AdmitStage | SectionStage | AfterStage;

/** The stages of a path in the order a request visits them. */
export function stagesOf(path: RequestPath): readonly AnyStage[] {
  return [...path.prepare, path.gate, path.admit, ...path.section, ...path.after];
}

/** What a committer needs of the core: the admit gate, the commit section, and the lifecycle of a charge it holds. */
export interface CommitPort {
  /** Admits (the admit stage), then runs `then` in the same synchronous step. */
  admit<T>(ctx: PlannedContext, then: () => T): T | Promise<T>;
  /** The commit section (select -> charge), synchronously: the request charged. */
  section(ctx: PlannedContext, mode: CommitMode): RoutedRequest;
  committed(r: RoutedRequest): void;
  publishCharge(r: RoutedRequest): void;
  retract(r: RoutedRequest, keepCounts?: boolean): void;
  uncount(r: RoutedRequest): void;
}

/** How a model's charges become shared (stages/commit.ts: eventual; the gateway's strict-commit.ts: strict). */
export interface Committer {
  commit(ctx: PlannedContext, port: CommitPort): RoutedRequest | Promise<RoutedRequest>;
}

/** Observes each stage's time (seconds), in visiting order, with the request's context (read only: tracing keys its timeline on `ctx.input`). */
export type StageObserver = (stage: string, seconds: number, ctx: RequestContext) => void;

export class RequestPathDriver {
  readonly port: CommitPort;

  constructor(
    private readonly path: RequestPath,
    private readonly env: StageEnv,
    private readonly committerFor: (ctx: PlannedContext) => Committer,
    private readonly observe?: StageObserver,
  ) {
    const lc = env.lifecycle;
    this.port = {
      admit: (ctx, then) => this.around(path.admit, ctx, (inner) => path.admit.run(ctx, env, inner), then),
      section: (ctx, mode) => this.section(ctx, mode),
      committed: (r) => lc.committed(r),
      publishCharge: (r) => lc.publishCharge(r),
      retract: (r, keep) => lc.retract(r, keep),
      uncount: (r) => lc.uncount(r),
    };
  }

  /** The whole path: prepare, flow gate, commit, after. Synchronous when no stage waits. */
  route(input: RouteInput): RoutedRequest | Promise<RoutedRequest> {
    const ctx = contextOf(input);
    const prepared = this.prepareFrom(ctx, 0);
    return prepared instanceof Promise ? prepared.then((p) => this.gated(p)) : this.gated(prepared);
  }

  /** The prepare phase alone (/debug/explain). */
  prepare(input: RouteInput): PlannedContext | Promise<PlannedContext> {
    return this.prepareFrom(contextOf(input), 0);
  }

  /** The commit section on a planned context: select -> charge, with no await in between. */
  section(ctx: PlannedContext, mode: CommitMode): RoutedRequest {
    ctx.commitMode = mode;
    for (const s of this.path.section) this.step(s, ctx, () => s.run(ctx, this.env));
    const r = ctx.routed;
    if (!r) throw new Error("the commit section charged nothing");
    return r;
  }

  /**
   * Runs the prepare stages from `from`. With turn slicing, stages that together ran past the
   * budget in one turn, or a stage of a large request (`isLargeBody`) that awaited, hand the loop
   * back (one macrotask) before the next stage and before the flow gate: another request's short
   * work runs in between. The select -> charge section is never split.
   */
  private prepareFrom(ctx: RequestContext, from: number, turnStart = performance.now()): PlannedContext | Promise<PlannedContext> {
    const stages = this.path.prepare;
    const turns = this.env.turns;
    for (let i = from; i < stages.length; i++) {
      const s = stages[i] as PrepareStage;
      const r = this.step(s, ctx, () => s.run(ctx, this.env));
      // A stage that awaited: a large request's continuation starts in a turn of its own (what
      // follows its await — ids, hashes — is the large part); a small one's continues at once.
      if (r instanceof Promise) return turns && isLargeBody(ctx.input.body.length) ? r.then(() => turns.yieldTurn()).then(() => this.prepareFrom(ctx, i + 1)) : r.then(() => this.prepareFrom(ctx, i + 1));
      if (turns && shouldYieldTurn(performance.now() - turnStart, turns.budgetMs)) return turns.yieldTurn().then(() => this.prepareFrom(ctx, i + 1));
    }
    if (!isPlanned(ctx)) throw new Error("the prepare stages left the request without a plan");
    return ctx;
  }

  private gated(ctx: PlannedContext): RoutedRequest | Promise<RoutedRequest> {
    const gate = this.path.gate;
    return this.around<RoutedRequest | Promise<RoutedRequest>>(gate, ctx, (inner) => gate.run(ctx, this.env, inner), () => this.committed(ctx)) as RoutedRequest | Promise<RoutedRequest>;
  }

  /**
   * Runs a stage that calls the rest of the path itself (the flow gate, the admit gate): its time
   * runs until it calls `inner` (a hold included), so the stages inside are timed on their own.
   */
  private around<T>(s: AnyStage, ctx: RequestContext, run: (inner: () => T) => T | Promise<T>, inner: () => T): T | Promise<T> {
    const t0 = performance.now();
    let timed = false;
    const time = () => {
      if (timed) return;
      timed = true;
      this.observe?.(s.name, (performance.now() - t0) / 1000, ctx);
    };
    const proceed = () => {
      time();
      return inner();
    };
    try {
      const r = run(proceed);
      return r instanceof Promise
        ? r.catch((err: unknown) => {
            time();
            return Promise.reject(this.refused(err, s, ctx));
          })
        : r;
    } catch (err) {
      time();
      throw this.refused(err, s, ctx);
    }
  }

  private committed(ctx: PlannedContext): RoutedRequest | Promise<RoutedRequest> {
    const r = this.committerFor(ctx).commit(ctx, this.port);
    if (this.path.after.length === 0) return r;
    return r instanceof Promise ? r.then((x) => this.afterFrom(x, ctx, 0)) : this.afterFrom(r, ctx, 0);
  }

  private afterFrom(routed: RoutedRequest, ctx: PlannedContext, from: number): RoutedRequest | Promise<RoutedRequest> {
    const stages = this.path.after;
    let r = routed;
    for (let i = from; i < stages.length; i++) {
      const s = stages[i] as AfterStage;
      const next = this.step(s, ctx, () => s.run(r, ctx, this.env));
      if (next instanceof Promise) return next.then((x) => this.afterFrom(x, ctx, i + 1));
      r = next;
    }
    return r;
  }

  /** Runs one stage: its time observed (until it settles), a refusal named after it. */
  private step<T>(s: AnyStage, ctx: RequestContext, run: () => T | Promise<T>): T | Promise<T> {
    const t0 = performance.now();
    let r: T | Promise<T>;
    try {
      r = run();
    } catch (err) {
      this.observe?.(s.name, (performance.now() - t0) / 1000, ctx);
      throw this.refused(err, s, ctx);
    }
    if (!(r instanceof Promise)) {
      this.observe?.(s.name, (performance.now() - t0) / 1000, ctx);
      return r;
    }
    return r.then(
      (v) => {
        this.observe?.(s.name, (performance.now() - t0) / 1000, ctx);
        return v;
      },
      (err: unknown) => {
        this.observe?.(s.name, (performance.now() - t0) / 1000, ctx);
        throw this.refused(err, s, ctx);
      },
    );
  }

  /** Names the stage that refused (the innermost one: a refusal is named once) and what its record keeps. */
  private refused(err: unknown, s: AnyStage, ctx: RequestContext): unknown {
    if (!(err instanceof RouteError) || err.refusal) return err;
    const tag = ctx.semantic ?? ctx.semanticRefusal;
    const model = tag?.virtualModel ?? ctx.parsed?.model;
    err.refusal = { stage: s.name, phase: s.phase, ...(model !== undefined ? { model } : {}), ...(tag ? { semantic: semanticRecordOf(tag) } : {}) };
    return err;
  }
}
