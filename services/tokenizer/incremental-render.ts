/**
 * Rendering a later turn of a conversation from the previous turn's render, for message-local
 * templates (message-local.ts): the render is `pre` + one piece per message + `post`, each piece a
 * function of its message and of whether it is the first. So a request whose first k messages are
 * those of a cached render of the same conversation renders: `pre`, the cached pieces, the pieces
 * of its new messages (the loop over [message k-1, new messages…], minus the piece of message k-1
 * as a first message, rendered alone), and `post` — a few small renders instead of the whole
 * conversation. The same template object (@huggingface/jinja) renders every part, so the text is
 * the full render's by construction; tests compare both on real templates.
 *
 * Cache (ByteLru, bounded in bytes): per conversation (key: a digest of the template's name,
 * everything in the render context but the messages, and the first two messages), its messages
 * (as normalised) and the loop's text for them. A request reuses an entry only when its first
 * messages are exactly the entry's (string fields compared — a memory compare for the flat strings
 * a JSON parse makes — other fields by their JSON); otherwise (an edited history, another
 * conversation) the loop is rendered whole — the full path, with the same text. An entry holds
 * about twice the conversation's text (`renderEntryBytes`). Pure but for the key digest
 * (node:crypto).
 */
import { createHash } from "node:crypto";
import { Template } from "@huggingface/jinja";
import { ByteLru } from "./byte-lru.js";
import { sameMessage } from "./same-message.js";
import type { MessageLoop } from "./message-local.js";

interface Entry {
  /** The messages rendered (as normalised for the template; their strings are compared, not hashed). */
  messages: readonly Record<string, unknown>[];
  loop: string;
  /** `pre` and `post` as rendered for this entry's context (the key covers it), when they are fixed (`edgesFixed`). */
  pre?: string;
  post?: string;
}


/** Characters held by a message's string fields (what an entry keeps alive). */
function messageChars(m: Record<string, unknown>): number {
  let n = 0;
  for (const v of Object.values(m)) n += typeof v === "string" ? v.length : 64;
  return n;
}

export interface IncrementalRenderStats {
  /** Renders that reused a cached conversation, and the messages they did not render again. */
  hits: number;
  reusedMessages: number;
  misses: number;
  entries: number;
  bytes: number;
}

export const DEFAULT_RENDER_CACHE_BYTES = 64 * 1024 * 1024;

/** What an entry weighs: the loop text and the messages' strings (UTF-16, 2 bytes a char at worst), ~100 bytes a message object, ~200 of overhead. */
export function renderEntryBytes(loopChars: number, messageChars: number, messages: number): number {
  return 2 * (loopChars + messageChars) + 100 * messages + 200;
}

const digest = (s: string) => createHash("sha1").update(s).digest("base64");

export class IncrementalRender {
  private readonly pre: Template;
  private readonly loop: Template;
  private readonly post: Template;
  private readonly lru: ByteLru<Entry>;
  readonly stats: IncrementalRenderStats = { hits: 0, reusedMessages: 0, misses: 0, entries: 0, bytes: 0 };

  /** `source`: the template (message-local, per `where`). */
  constructor(source: string, private readonly where: MessageLoop, maxBytes: number) {
    const part = (body: unknown[]) => {
      const t = new Template(source);
      (t as unknown as { parsed: { type: string; body: unknown[] } }).parsed = { type: "Program", body };
      return t;
    };
    const body = new Template(source).parsed.body as unknown[];
    this.pre = part(body.slice(0, where.at));
    this.loop = part([body[where.at]]);
    this.post = part(body.slice(where.at + 1));
    this.lru = new ByteLru(maxBytes);
    // `pre` and `post` render with `messages` empty: a function of the rest of the context (part of
    // the entry's key), kept with the entry, unless the template reads the clock.
    this.edgesFixed = !source.includes("strftime_now");
  }

  private readonly edgesFixed: boolean;

  private edges(l: RenderLookup): { pre: string; post: string } {
    const e = l.entry;
    if (this.edgesFixed && e?.pre !== undefined && e.post !== undefined) return { pre: e.pre, post: e.post };
    return { pre: this.pre.render({ ...l.rest, messages: [] }), post: this.post.render({ ...l.rest, messages: [] }) };
  }

  private loopOver(context: Record<string, unknown>, messages: readonly unknown[]): string {
    const ctx: Record<string, unknown> = { ...context };
    for (const n of this.where.iterableNames) ctx[n] = messages;
    return this.loop.render(ctx);
  }

  /** Looks the conversation up: `entry` when a cached render covers its first messages. Cheap: the first two messages are hashed, the rest compared. */
  lookup(name: string, context: Record<string, unknown>): RenderLookup {
    const messages = context.messages as readonly Record<string, unknown>[];
    const { messages: _, ...rest } = context;
    const head = messages.slice(0, 2).map((m) => JSON.stringify(m)).join("\u0000");
    const key = digest(`${name}\u0000${JSON.stringify(rest)}\u0000${head}`);
    const entry = this.lru.get(key);
    const reusable = entry !== undefined && entry.messages.length > 0 && entry.messages.length <= messages.length && entry.messages.every((m, i) => sameMessage(m, messages[i] as Record<string, unknown>));
    return { key, rest, messages, ...(reusable ? { entry } : {}) };
  }

  /** The render of a reusable lookup: the cached pieces plus the new messages' (a few small renders). Throws what the template throws. */
  renderFrom(l: RenderLookup): string {
    const e = l.entry as Entry;
    const k = e.messages.length;
    this.stats.hits++;
    this.stats.reusedMessages += k;
    let loop = e.loop;
    if (l.messages.length > k) {
      const prev = l.messages[k - 1];
      loop += this.loopOver(l.rest, [prev, ...l.messages.slice(k)]).slice(this.loopOver(l.rest, [prev]).length);
    }
    const { pre, post } = this.edges(l);
    this.store(l, loop, pre, post);
    return pre + loop + post;
  }

  /** After a full render (elsewhere, e.g. a worker) of a lookup that was not reusable: caches its loop part. */
  remember(l: RenderLookup, fullText: string): void {
    this.stats.misses++;
    const { pre, post } = this.edges(l);
    if (!fullText.startsWith(pre) || !fullText.endsWith(post) || fullText.length < pre.length + post.length) return;
    this.store(l, fullText.slice(pre.length, fullText.length - post.length), pre, post);
  }

  /** Renders on this thread, reusing what it can (tests, and callers without a worker). */
  render(name: string, context: Record<string, unknown>): string {
    const l = this.lookup(name, context);
    if (l.entry) return this.renderFrom(l);
    const text = this.pre.render(context) + this.loopOver(l.rest, l.messages) + this.post.render(context);
    this.remember(l, text);
    return text;
  }

  private store(l: RenderLookup, loop: string, pre: string, post: string): void {
    let chars = 0;
    for (const m of l.messages) chars += messageChars(m);
    const edges = this.edgesFixed ? { pre, post } : {};
    this.lru.set(l.key, { messages: l.messages, loop, ...edges }, renderEntryBytes(loop.length + (this.edgesFixed ? pre.length + post.length : 0), chars, l.messages.length));
    this.stats.entries = this.lru.size;
    this.stats.bytes = this.lru.bytes;
  }
}

export interface RenderLookup {
  key: string;
  rest: Record<string, unknown>;
  messages: readonly Record<string, unknown>[];
  entry?: Entry;
}
