/**
 * Model configs folded from the config bucket, and the strategy-selection rule. Pure.
 *
 * Selection, highest first (as AIBrix): the model's `lockedRoutingStrategy`; the request's
 * `routing-strategy` header; the selected profile's `routingStrategy` (header `config-profile`
 * names it, `auto` picks the profile whose routing hints match the request best, else the
 * model's `defaultProfile`); the gateway's default.
 */
import type { ModelConfig, Profile, RateLimits, RoutingHints } from "../../schemas/config.js";

export interface StrategyChoice {
  spec: string;
  source: "locked" | "header" | "profile" | "default";
  profile?: string;
}

export interface ConfigReader {
  get(model: string): ModelConfig | undefined;
  /** A user's per-minute limits (the user's own entry, else `default`), if any. */
  userLimits(user: string | undefined): { rpm?: number; tpm?: number } | undefined;
  /** `requestsPerSecond`: the model's request-rate limit for this request (the applied profile's, else the default profile's). */
  choose(model: string, headers: Readonly<Record<string, string>>, hints: { promptTokens: number; maxTokens?: number }, fallback: string): StrategyChoice & { profileConfig?: Profile; requestsPerSecond?: number };
}

function hintScore(h: RoutingHints | undefined, promptTokens: number, maxTokens: number | undefined): number {
  if (!h) return 0;
  let score = 0;
  const test = (v: number | undefined, ok: (x: number) => boolean) => {
    if (v === undefined) return true;
    if (!ok(v)) return false;
    score++;
    return true;
  };
  const m = maxTokens ?? 0;
  const fits =
    test(h.promptTokensGte, (x) => promptTokens >= x) &&
    test(h.promptTokensLt, (x) => promptTokens < x) &&
    test(h.maxTokensGte, (x) => m >= x) &&
    test(h.maxTokensLt, (x) => m < x);
  return fits ? score : -1;
}

export class ModelConfigView implements ConfigReader {
  private readonly models = new Map<string, ModelConfig>();
  private limits: RateLimits = {};
  version = 0;
  /** InferencePool objectives by model (pool-policies.ts), merged into `flowControl.objectives`. */
  private poolObjectives: ReadonlyMap<string, Readonly<Record<string, { priority: number }>>> = new Map();
  /** The merged configs handed out, one object per model until something changes (flow control caches per object). */
  private readonly merged = new Map<string, ModelConfig>();

  /** The InferencePool objectives of every model (replaces the previous ones). */
  setPoolObjectives(byModel: ReadonlyMap<string, Readonly<Record<string, { priority: number }>>>): void {
    this.poolObjectives = byModel;
    this.merged.clear();
    this.version++;
  }

  setLimits(limits: RateLimits | undefined): void {
    this.limits = limits ?? {};
    this.version++;
  }

  userLimits(user: string | undefined): { rpm?: number; tpm?: number } | undefined {
    const users = this.limits.users;
    if (!users) return undefined;
    // Own properties only: a user named `constructor` or `__proto__` is a user like any other.
    return (user && Object.hasOwn(users, user) ? users[user] : undefined) ?? (Object.hasOwn(users, "default") ? users.default : undefined);
  }

  set(model: string, config: ModelConfig | undefined): void {
    if (config) this.models.set(model, config);
    else this.models.delete(model);
    this.merged.delete(model);
    this.version++;
  }

  /** The whole rate-limits entry (state comparison). */
  userLimitsAll(): RateLimits {
    return this.limits;
  }

  /**
   * The model's config. With flow control on and InferencePool objectives for the model, its
   * `flowControl.objectives` also holds the pools' objectives (its own win on a name clash).
   */
  get(model: string): ModelConfig | undefined {
    const c = this.models.get(model);
    if (!c?.flowControl) return c;
    const cached = this.merged.get(model);
    if (cached) return cached;
    const pool = this.poolObjectives.get(model);
    if (!pool) return c;
    const m: ModelConfig = { ...c, flowControl: { ...c.flowControl, objectives: { ...pool, ...(c.flowControl.objectives ?? {}) } } };
    this.merged.set(model, m);
    return m;
  }

  /** Models with a config. */
  modelNames(): string[] {
    return [...this.models.keys()];
  }

  /** The model's consistency mode, if its config sets one. */
  consistency(model: string): "eventual" | "strict" | undefined {
    return this.models.get(model)?.consistency;
  }

  choose(model: string, headers: Readonly<Record<string, string>>, hints: { promptTokens: number; maxTokens?: number }, fallback: string) {
    const c = this.models.get(model);
    if (c?.lockedRoutingStrategy) return { spec: c.lockedRoutingStrategy, source: "locked" as const };
    const profileName = this.profileFor(c, headers["config-profile"], hints);
    const profileConfig = profileName && c?.profiles && Object.hasOwn(c.profiles, profileName) ? c.profiles[profileName] : undefined;
    // The model's request rate: the applied profile's, else its default profile's, so naming a
    // profile that sets none cannot escape the limit the model's default applies.
    const defaultProfile = c?.defaultProfile && c.profiles && Object.hasOwn(c.profiles, c.defaultProfile) ? c.profiles[c.defaultProfile] : undefined;
    const rps = profileConfig?.requestsPerSecond ?? defaultProfile?.requestsPerSecond;
    const limit = rps !== undefined ? { requestsPerSecond: rps } : {};
    const header = headers["routing-strategy"];
    if (header) return { spec: header, source: "header" as const, ...limit, ...(profileName ? { profile: profileName, profileConfig } : {}) };
    if (profileConfig?.routingStrategy) return { spec: profileConfig.routingStrategy, source: "profile" as const, ...limit, profile: profileName, profileConfig };
    return { spec: fallback, source: "default" as const, ...limit, ...(profileName ? { profile: profileName, profileConfig } : {}) };
  }

  private profileFor(c: ModelConfig | undefined, requested: string | undefined, hints: { promptTokens: number; maxTokens?: number }): string | undefined {
    const profiles = c?.profiles;
    if (!profiles) return undefined;
    if (requested && requested !== "auto") return Object.hasOwn(profiles, requested) ? requested : c.defaultProfile;
    if (requested === "auto") {
      let best: string | undefined;
      let bestScore = 0;
      for (const [name, p] of Object.entries(profiles)) {
        const s = hintScore(p.routingConfig, hints.promptTokens, hints.maxTokens);
        if (s > bestScore) {
          best = name;
          bestScore = s;
        }
      }
      if (best) return best;
    }
    return c.defaultProfile;
  }
}
