/**
 * Semantic model selection (docs/semantic.md): a model config with `semantic` makes its name a
 * *virtual model*. A request for it is classified by named signals, the decisions' boolean rules
 * over those signals are evaluated, and the winning decision's action names the real model that
 * serves it (and may set a system prompt, `chat_template_kwargs`, a profile or a strategy).
 *
 * The schema bounds every list and string; what a schema cannot say (rules naming defined
 * signals, regexes the linear-time engine accepts, a rule's depth) is checked by
 * services/routing/semantic/rules.ts.
 */
import { type Static, Type } from "@sinclair/typebox";

const Name = Type.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" });
const ModelName = Type.String({ minLength: 1, maxLength: 256 });
/** Which text a text signal reads: the last user message (default) or every message. */
const Scope = Type.Union([Type.Literal("last-user"), Type.Literal("conversation")]);

export const KeywordsSignal = Type.Object(
  {
    type: Type.Literal("keywords"),
    keywords: Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { minItems: 1, maxItems: 256 }),
    /** `any` (default): one keyword present is enough; `all`: every keyword must be. */
    match: Type.Optional(Type.Union([Type.Literal("any"), Type.Literal("all")])),
    caseSensitive: Type.Optional(Type.Boolean()),
    scope: Type.Optional(Scope),
  },
  { additionalProperties: false },
);

export const RegexSignal = Type.Object(
  {
    type: Type.Literal("regex"),
    /** RE2 syntax (linear time: no backreferences or lookaround). */
    pattern: Type.String({ minLength: 1, maxLength: 1024 }),
    caseSensitive: Type.Optional(Type.Boolean()),
    scope: Type.Optional(Scope),
    /** Characters of its text the regex reads (the start; default 1024: RE2 in WebAssembly costs ~40 ns a character). */
    maxChars: Type.Optional(Type.Integer({ minimum: 16, maximum: 1_048_576 })),
  },
  { additionalProperties: false },
);

export const PromptTokensSignal = Type.Object(
  {
    type: Type.Literal("prompt-tokens"),
    gte: Type.Optional(Type.Integer({ minimum: 0 })),
    lt: Type.Optional(Type.Integer({ minimum: 1 })),
  },
  { additionalProperties: false },
);

export const LanguageSignal = Type.Object(
  {
    type: Type.Literal("language"),
    /** ISO 639-1 codes (`en`, `fr`, …); true when the detected language is one of them. */
    languages: Type.Array(Type.String({ minLength: 2, maxLength: 3, pattern: "^[a-z]{2,3}$" }), { minItems: 1, maxItems: 64 }),
    scope: Type.Optional(Scope),
  },
  { additionalProperties: false },
);

export const HeaderSignal = Type.Object(
  {
    type: Type.Literal("header"),
    /** A request header (lower-case). */
    name: Type.String({ minLength: 1, maxLength: 128, pattern: "^[a-z0-9-]+$" }),
    /** True when the header has one of these values; absent: when the header is present. */
    values: Type.Optional(Type.Array(Type.String({ maxLength: 256 }), { minItems: 1, maxItems: 64 })),
  },
  { additionalProperties: false },
);

export const UserSignal = Type.Object(
  {
    type: Type.Literal("user"),
    /** The request's user (its API key's user under `--auth required`, else the `user` header). */
    users: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { minItems: 1, maxItems: 1024 })),
    /** The API key's `class` (`config add-key --class`). */
    classes: Type.Optional(Type.Array(Name, { minItems: 1, maxItems: 64 })),
  },
  { additionalProperties: false },
);

export const SimilaritySignal = Type.Object(
  {
    type: Type.Literal("similarity"),
    /** Example utterances: the signal's score is the text's best cosine similarity to one of them. */
    examples: Type.Array(Type.String({ minLength: 1, maxLength: 2048 }), { minItems: 1, maxItems: 64 }),
    /** True when the embedding score reaches this (cosine, -1..1). */
    threshold: Type.Number({ minimum: -1, maximum: 1 }),
    /** True when the lexical fallback's score reaches this (word-set cosine, 0..1; default: `threshold`). */
    lexicalThreshold: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
    /**
     * Similarity signals of one group act as one classifier: only the group's best-scoring signal
     * (among those over their threshold) is true, so the decision follows the closest examples
     * rather than the highest priority of several that are close enough.
     */
    group: Type.Optional(Type.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" })),
    scope: Type.Optional(Scope),
  },
  { additionalProperties: false },
);

export const Signal = Type.Union([KeywordsSignal, RegexSignal, PromptTokensSignal, LanguageSignal, HeaderSignal, UserSignal, SimilaritySignal]);

/** A boolean rule: a signal's name, or `all` / `any` / `not` of rules (depth checked: at most 8). */
export const Rule = Type.Recursive(
  (This) =>
    Type.Union([
      Name,
      Type.Object({ all: Type.Array(This, { minItems: 1, maxItems: 32 }) }, { additionalProperties: false }),
      Type.Object({ any: Type.Array(This, { minItems: 1, maxItems: 32 }) }, { additionalProperties: false }),
      Type.Object({ not: This }, { additionalProperties: false }),
    ]),
  { $id: "semantic-rule" },
);

export const SemanticAction = Type.Object(
  {
    /** The real model (or adapter) the request goes to: its pods, pool, permissions, limits and strategy. */
    model: ModelName,
    /** A system prompt: `prepend` adds it before the conversation, `replace` also drops the client's system messages. */
    systemPrompt: Type.Optional(Type.Object({ text: Type.String({ minLength: 1, maxLength: 16_384 }), mode: Type.Optional(Type.Union([Type.Literal("prepend"), Type.Literal("replace")])) }, { additionalProperties: false })),
    /** Merged into the body's `chat_template_kwargs` (e.g. `{"enable_thinking": true}`). */
    chatTemplateKwargs: Type.Optional(Type.Record(Type.String({ minLength: 1, maxLength: 64 }), Type.Union([Type.Boolean(), Type.Number(), Type.String({ maxLength: 256 })]), { maxProperties: 16 })),
    /** A profile of the target model's config (as the `config-profile` header would name it). */
    profile: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
    /** A routing strategy for this decision (as the `routing-strategy` header; the target's locked strategy still wins). */
    routingStrategy: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
  },
  { additionalProperties: false },
);

export const SemanticDecision = Type.Object(
  {
    name: Name,
    /** Highest wins among the decisions whose rule holds; equal priorities: the first listed. */
    priority: Type.Integer({ minimum: -1000, maximum: 1000 }),
    when: Rule,
    action: SemanticAction,
  },
  { additionalProperties: false },
);

export const SemanticConfig = Type.Object(
  {
    signals: Type.Record(Name, Signal, { maxProperties: 64 }),
    decisions: Type.Array(SemanticDecision, { maxItems: 64 }),
    /** The action when no decision matches (absent: such a request is answered 400 `no_matching_decision`). */
    default: Type.Optional(SemanticAction),
    /** The model whose pods serve `/v1/embeddings` for `similarity` signals (absent: the lexical fallback only). */
    embeddingModel: Type.Optional(ModelName),
    /** How long the gateway waits for an embedding before using the lexical fallback (default 50 ms). */
    embeddingTimeoutMs: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000 })),
    /** Text signals read at most this many characters of their text (its start; default 4096). */
    maxClassifiedChars: Type.Optional(Type.Integer({ minimum: 64, maximum: 1_048_576 })),
  },
  { additionalProperties: false },
);

export type Signal = Static<typeof Signal>;
export type Rule = Static<typeof Rule>;
export type SemanticAction = Static<typeof SemanticAction>;
export type SemanticDecision = Static<typeof SemanticDecision>;
export type SemanticConfig = Static<typeof SemanticConfig>;
