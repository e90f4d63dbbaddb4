/**
 * A later turn of a conversation rendered from the previous turn's pieces, for templates whose
 * message loop reads more than its own message (window-loop.ts: Qwen3's reads the last user
 * query's position, its neighbours' roles, whether a message is the last). The render is `pre` +
 * one piece per message + `post`; `pre` and `post` are rendered on every request (Qwen3's `pre`
 * scans the messages for the last user query: cheap next to the pieces), and each piece is either
 * reused or rendered again:
 * - while a piece renders, the values of the context reads it evaluates are recorded, in order
 *   (strings by reference, other values by a bounded serialisation);
 * - a cached piece is reused when its message is the same (string fields compared) and its
 *   recorded reads, evaluated again in the new conversation at the same position, give the same
 *   values. The piece is a function of its message and of those values (window-loop.ts), so the
 *   reused piece is exactly what rendering it again would give. When a new user task arrives,
 *   Qwen3's `loop.index0 > ns.last_query_index` changes for the assistant turns after the old
 *   query and those pieces (reasoning dropped) render again, the rest are reused.
 * The template runs in @huggingface/jinja's own interpreter, on an environment set up exactly as
 * `Template.render` sets it up (captured from it), with the loop driven here one iteration at a
 * time; anything unexpected (an error, a value too large to record, a body-bound name read before
 * this iteration set it) makes `render` answer undefined and the caller renders whole.
 *
 * Cache (ByteLru, bounded in bytes): per conversation (the key of incremental-render.ts), its
 * messages, pieces and recorded reads; `windowEntryBytes`. Pure but for the key digest.
 */
import { createHash } from "node:crypto";
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import { ByteLru } from "./byte-lru.js";
import { sameMessage } from "./same-message.js";
import type { IncrementalRenderStats } from "./incremental-render.js";
import type { WindowLoop } from "./window-loop.js";

// biome-ignore lint/suspicious/noExplicitAny: runtime values and nodes of @huggingface/jinja are not exported as classes.
type Any = any;

/** A recorded context read: the node, the value's runtime type, and the value (a string by reference, else serialised). */
type Read = [node: Any, type: string, value: unknown];

interface Entry {
  messages: readonly Record<string, unknown>[];
  pieces: string[];
  reads: Read[][];
}

/** Longest serialisation of a non-string value recorded (a read of a whole message list does not qualify). */
const MAX_SERIAL_CHARS = 16_384;

class Unrecordable extends Error {}

function serial(v: Any, out: { n: number }): string {
  let s: string;
  switch (v.type) {
    case "StringValue":
      s = JSON.stringify(v.value);
      break;
    case "ArrayValue":
    case "TupleValue":
      s = `[${(v.value as Any[]).map((x) => serial(x, out)).join(",")}]`;
      break;
    case "ObjectValue":
    case "NamespaceValue":
    case "KeywordArgumentsValue":
      s = `{${[...(v.value as Map<string, Any>)].map(([k, x]) => `${JSON.stringify(k)}:${serial(x, out)}`).join(",")}}`;
      break;
    case "FunctionValue":
      s = "fn";
      break;
    default:
      s = String(v.value);
  }
  out.n += s.length;
  if (out.n > MAX_SERIAL_CHARS) throw new Unrecordable();
  return `${v.type}:${s}`;
}

function record(node: Any, v: Any): Read {
  return [node, v.type, v.type === "StringValue" ? v.value : serial(v, { n: 0 })];
}


/** What an entry weighs: pieces and messages' strings (2 bytes a char), ~60 bytes a read, ~150 a message, ~200 of overhead. */
export function windowEntryBytes(pieceChars: number, messageChars: number, reads: number, messages: number): number {
  return 2 * (pieceChars + messageChars) + 60 * reads + 150 * messages + 200;
}

/** The environment `Template.render` builds for `context` (globals + context), captured from its interpreter. */
function renderEnvironment(context: Record<string, unknown>): Environment {
  const proto = Interpreter.prototype as Any;
  const run = proto.run;
  let env: Environment | undefined;
  proto.run = function (this: Any, program: Any) {
    env = this.global;
    return run.call(this, program);
  };
  try {
    new Template("").render(context);
  } finally {
    proto.run = run;
  }
  return env as Environment;
}

const digest = (s: string) => createHash("sha1").update(s).digest("base64");

export interface WindowRenderStats extends IncrementalRenderStats {
  /** Pieces reused and rendered again on requests that found their conversation. */
  reusedPieces: number;
  renderedPieces: number;
  /** Renders given up (the caller rendered whole). */
  failed: number;
}

export class WindowRender {
  private readonly pre: Any[];
  private readonly post: Any[];
  private readonly loop: Any;
  private readonly lru: ByteLru<Entry>;
  readonly stats: WindowRenderStats = { hits: 0, reusedMessages: 0, misses: 0, entries: 0, bytes: 0, reusedPieces: 0, renderedPieces: 0, failed: 0 };

  /** `program`: the parsed template `where` was found in (windowLoop; its reads are that tree's nodes). */
  constructor(program: { body: readonly unknown[] }, private readonly where: WindowLoop, maxBytes: number) {
    const body = program.body as Any[];
    this.pre = body.slice(0, where.at);
    this.loop = body[where.at];
    this.post = body.slice(where.at + 1);
    this.lru = new ByteLru(maxBytes);
  }

  /** Keys by context object: `has` and `render` of one request digest it once. */
  private readonly keys = new WeakMap<Record<string, unknown>, { name: string; key: string }>();

  private key(name: string, context: Record<string, unknown>): string {
    const known = this.keys.get(context);
    if (known?.name === name) return known.key;
    const key = this.digestKey(name, context);
    this.keys.set(context, { name, key });
    return key;
  }

  private digestKey(name: string, context: Record<string, unknown>): string {
    const messages = context.messages as readonly Record<string, unknown>[];
    const { messages: _, ...rest } = context;
    const head = messages.slice(0, 2).map((m) => JSON.stringify(m)).join("\u0000");
    return digest(`${name}\u0000${JSON.stringify(rest)}\u0000${head}`);
  }

  /** Whether a conversation of this render has a cached entry (its later turn renders incrementally). */
  has(name: string, context: Record<string, unknown>): boolean {
    return this.lru.has(this.key(name, context));
  }

  /** The full render's text, reusing what it can; undefined when it gave up (the caller renders whole). */
  render(name: string, context: Record<string, unknown>): string | undefined {
    const messages = context.messages as readonly Record<string, unknown>[];
    const key = this.key(name, context);
    const entry = this.lru.get(key);
    let same = 0;
    if (entry) while (same < entry.messages.length && same < messages.length && sameMessage(entry.messages[same] as Record<string, unknown>, messages[same] as Record<string, unknown>)) same++;
    try {
      const out = this.run(context, entry, same);
      if (entry && same > 0) {
        this.stats.hits++;
        this.stats.reusedMessages += same;
      } else this.stats.misses++;
      let chars = 0;
      let reads = 0;
      for (const p of out.pieces) chars += p.length;
      for (const r of out.reads) reads += r.length;
      for (const m of messages) for (const v of Object.values(m)) chars += typeof v === "string" ? v.length : 64;
      this.lru.set(key, { messages, pieces: out.pieces, reads: out.reads }, windowEntryBytes(chars, 0, reads, messages.length));
      this.stats.entries = this.lru.size;
      this.stats.bytes = this.lru.bytes;
      return out.text;
    } catch {
      this.stats.failed++;
      this.lru.delete(key);
      return undefined;
    }
  }

  private run(context: Record<string, unknown>, entry: Entry | undefined, same: number): { text: string; pieces: string[]; reads: Read[][] } {
    const env = renderEnvironment(context);
    const interp = new Interpreter(env) as Any;
    const tracked = this.where.tracked;
    let recording: Read[] | undefined;
    const evaluate = interp.evaluate.bind(interp);
    interp.evaluate = (node: Any, e: Any) => {
      const v = evaluate(node, e);
      if (recording && tracked.has(node)) recording.push(record(node, v));
      return v;
    };
    const pre = interp.evaluateBlock(this.pre, env).value as string;
    // The loop's own scope, as evaluateFor makes it; a read that reaches it for a body-bound name
    // would see another iteration's value in a whole render.
    const scope = new Environment(env) as Any;
    const locals = this.where.locals;
    let stray = false;
    const resolve = scope.resolve;
    scope.resolve = function (this: Any, n: string) {
      if (locals.has(n)) stray = true;
      return resolve.call(this, n);
    };
    const iterable = interp.evaluate(this.loop.iterable, scope);
    if (iterable?.type !== "ArrayValue") throw new Unrecordable();
    const items = iterable.value as Any[];
    const n = items.length;
    const pieces = new Array<string>(n);
    const reads = new Array<Read[]>(n);
    // Checking a cached piece evaluates only its recorded reads (no assignments): one environment and
    // one `loop` object serve every check, their values replaced per position (ints and booleans shared).
    const check = new Environment(scope) as Any;
    const loopOf = (target: Any, i: number) => {
      target.set("loop", { index: i + 1, index0: i, revindex: n - i, revindex0: n - i - 1, first: i === 0, last: i === n - 1, length: n, previtem: undefined, nextitem: undefined });
      const lv = target.variables.get("loop").value as Map<string, Any>;
      if (i > 0) lv.set("previtem", items[i - 1]);
      if (i < n - 1) lv.set("nextitem", items[i + 1]);
      target.setVariable(this.where.loopvar, items[i]);
      return lv;
    };
    const shared = same > 0 ? loopOf(check, 0) : undefined;
    const ints = new Map<number, Any>();
    const int = (x: number) => {
      let v = ints.get(x);
      if (!v) {
        v = interp.evaluate({ type: "IntegerLiteral", value: x }, env);
        ints.set(x, v);
      }
      return v;
    };
    const bool = [(env as Any).lookupVariable("false"), (env as Any).lookupVariable("true")];
    if (bool[0]?.type !== "BooleanValue" || bool[1]?.type !== "BooleanValue") throw new Unrecordable();
    const undef = shared?.get("previtem");
    for (let i = 0; i < n; i++) {
      if (entry && shared && i < same) {
        shared.set("index", int(i + 1)).set("index0", int(i)).set("revindex", int(n - i)).set("revindex0", int(n - i - 1));
        shared.set("first", bool[i === 0 ? 1 : 0]).set("last", bool[i === n - 1 ? 1 : 0]);
        shared.set("previtem", i > 0 ? items[i - 1] : undef).set("nextitem", i < n - 1 ? items[i + 1] : undef);
        check.setVariable(this.where.loopvar, items[i]);
        const old = entry.reads[i] as Read[];
        let ok = true;
        for (const [node, type, value] of old) {
          const v = interp.evaluate(node, check);
          if (v.type !== type || (type === "StringValue" ? v.value !== value : serial(v, { n: 0 }) !== value)) {
            ok = false;
            break;
          }
        }
        if (ok) {
          pieces[i] = entry.pieces[i] as string;
          reads[i] = old;
          this.stats.reusedPieces++;
          continue;
        }
      }
      const it = new Environment(scope) as Any;
      loopOf(it, i);
      recording = [];
      pieces[i] = interp.evaluateBlock(this.loop.body, it).value as string;
      reads[i] = recording;
      recording = undefined;
      if (stray) throw new Unrecordable();
      if (entry) this.stats.renderedPieces++;
    }
    const post = interp.evaluateBlock(this.post, env).value as string;
    return { text: pre + pieces.join("") + post, pieces, reads };
  }
}
