/**
 * Which chat templates render each message on its own, so a later turn can render only its new
 * messages: a syntactic check of the template's syntax tree (@huggingface/jinja's), conservative —
 * anything it does not understand makes the template "not message-local" and every request takes
 * the full render. Pure.
 *
 * A template is message-local when its top level is `pre`, then one `{% for m in messages %}`
 * (or over a variable set to `messages` in `pre`), then `post`, and:
 * - `messages` (or its alias) appears nowhere else: no `messages|length`, no `messages[i]`;
 * - `pre` and `post` read neither `messages`, `loop`, nor a variable the loop assigns;
 * - the loop body reads only: the loop variable; `loop.first`, `loop.index0 == 0` or
 *   `loop.index == 1` (whether it is the first message, nothing else about its position);
 *   variables the template never assigns (the render's context: special tokens, `tools`,
 *   `add_generation_prompt`, keyword arguments); and variables the body itself assigned earlier
 *   in the same iteration, unconditionally (so a value set in one iteration is never read in the
 *   next, whatever the engine's scoping);
 * - no macros, no `namespace()`/`cycler()`/`joiner()` (state carried across iterations), no
 *   attribute assignment, no `break`/`continue`/`else` on that loop.
 * Then the render is `pre` + the loop's output for each message (a function of that message and
 * whether it is the first) + `post`, which is what incremental rendering relies on
 * (incremental-render.ts). The Llama-3 template is message-local; Qwen3's is not (it scans
 * `messages` backwards for the last user query, and looks at neighbouring messages).
 */

// biome-ignore lint/suspicious/noExplicitAny: the parser's node classes are not exported; nodes are read by their `type`.
type Node = any;

export interface MessageLoop {
  /** Index of the loop in the program's top-level body. */
  at: number;
  /** Names the loop's iterable may be bound to (`messages` and an alias). */
  iterableNames: string[];
}

class NotLocal extends Error {}

const STATEFUL_CALLS = new Set(["namespace", "cycler", "joiner"]);

/** Variable names an expression reads, in evaluation order (`loop` uses checked by the caller). */
function reads(e: Node, out: Node[]): void {
  if (!e) return;
  switch (e.type) {
    case "Identifier":
      out.push(e);
      return;
    case "StringLiteral":
    case "IntegerLiteral":
    case "FloatLiteral":
    case "BooleanLiteral":
    case "NullLiteral":
      return;
    case "ArrayLiteral":
    case "TupleLiteral":
      for (const x of e.value) reads(x, out);
      return;
    case "ObjectLiteral":
      for (const [k, v] of e.value) {
        reads(k, out);
        reads(v, out);
      }
      return;
    case "MemberExpression":
      reads(e.object, out);
      if (e.computed) reads(e.property, out);
      else out.push({ type: "Member", object: e.object, property: e.property });
      return;
    case "CallExpression":
      if (e.callee?.type === "Identifier" && STATEFUL_CALLS.has(e.callee.value)) throw new NotLocal(`${e.callee.value}()`);
      reads(e.callee, out);
      for (const a of e.args) reads(a, out);
      return;
    case "KeywordArgumentExpression":
      reads(e.value, out);
      return;
    case "FilterExpression":
      reads(e.operand, out);
      if (e.filter?.type === "CallExpression") for (const a of e.filter.args) reads(a, out);
      return;
    case "TestExpression":
      reads(e.operand, out);
      return;
    case "BinaryExpression":
      out.push({ type: "Binary", node: e });
      reads(e.left, out);
      reads(e.right, out);
      return;
    case "UnaryExpression":
      reads(e.argument, out);
      return;
    case "Ternary":
      reads(e.condition, out);
      reads(e.trueExpr, out);
      reads(e.falseExpr, out);
      return;
    case "SelectExpression":
      reads(e.lhs, out);
      reads(e.test, out);
      return;
    case "SliceExpression":
      reads(e.start, out);
      reads(e.stop, out);
      reads(e.step, out);
      return;
    default:
      throw new NotLocal(`expression ${String(e.type)}`);
  }
}

/** Every name assigned anywhere (set targets, loop variables). */
function assigned(stmts: readonly Node[], out: Set<string>): void {
  for (const s of stmts) {
    if (s.type === "Set") {
      if (s.assignee?.type === "Identifier") out.add(s.assignee.value);
      else if (s.assignee?.type === "TupleLiteral") for (const x of s.assignee.value) out.add(x.value);
      else throw new NotLocal("attribute assignment");
      assigned(s.body ?? [], out);
    } else if (s.type === "For") {
      if (s.loopvar?.type === "Identifier") out.add(s.loopvar.value);
      else for (const x of s.loopvar?.value ?? []) out.add(x.value);
      assigned(s.body, out);
      assigned(s.defaultBlock ?? [], out);
    } else if (s.type === "If") {
      assigned(s.body, out);
      assigned(s.alternate, out);
    } else if (s.type === "Macro") throw new NotLocal("macro");
  }
}

const isIntLit = (e: Node, v: number) => e?.type === "IntegerLiteral" && e.value === v;

/** `loop.first`, `loop.index0 == 0`, `loop.index == 1` (either side): the only position the body may read. */
function firstTest(b: Node): boolean {
  if (b.operator?.value !== "==") return false;
  const m = b.left?.type === "MemberExpression" ? b.left : b.right;
  const lit = m === b.left ? b.right : b.left;
  if (m?.type !== "MemberExpression" || m.computed || m.object?.type !== "Identifier" || m.object.value !== "loop") return false;
  return (m.property.value === "index0" && isIntLit(lit, 0)) || (m.property.value === "index" && isIntLit(lit, 1));
}

interface Scope {
  /** Names readable here: the loop variable, nested loop variables, definitely assigned locals. */
  local: Set<string>;
  /** Names assigned anywhere in the template (reading one not in `local` is not allowed). */
  assignedAnywhere: Set<string>;
  forbidden: Set<string>;
  /** Inside a nested loop: `loop` is that loop's (unrestricted). */
  nested: boolean;
}

function checkReads(e: Node, sc: Scope): void {
  const out: Node[] = [];
  reads(e, out);
  // `loop.index0 == 0` style comparisons cover their own `loop` read.
  const allowedLoop = new Set<Node>();
  for (const r of out) {
    if (r.type === "Binary" && firstTest(r.node)) {
      const m = r.node.left?.type === "MemberExpression" ? r.node.left : r.node.right;
      allowedLoop.add(m.object);
    }
    if (r.type === "Member" && r.object?.type === "Identifier" && r.object.value === "loop" && r.property?.value === "first") allowedLoop.add(r.object);
  }
  for (const r of out) {
    if (r.type !== "Identifier") continue;
    const name = r.value as string;
    if (sc.forbidden.has(name)) throw new NotLocal(`reads ${name}`);
    if (name === "loop") {
      if (sc.nested || allowedLoop.has(r)) continue;
      throw new NotLocal("reads the loop's position beyond whether it is the first");
    }
    if (sc.local.has(name)) continue;
    if (sc.assignedAnywhere.has(name)) throw new NotLocal(`reads ${name} before this iteration assigns it`);
  }
}

function checkBody(stmts: readonly Node[], sc: Scope, top: boolean): void {
  for (const s of stmts) {
    switch (s.type) {
      case "Set":
        if (s.value) checkReads(s.value, sc);
        checkBody(s.body ?? [], sc, false);
        // Only an unconditional assignment makes the name readable afterwards.
        if (s.assignee?.type === "Identifier") sc.local.add(s.assignee.value);
        break;
      case "If": {
        checkReads(s.test, sc);
        checkBody(s.body, { ...sc, local: new Set(sc.local) }, false);
        checkBody(s.alternate, { ...sc, local: new Set(sc.local) }, false);
        break;
      }
      case "For": {
        checkReads(s.iterable, sc);
        const inner = new Set(sc.local);
        if (s.loopvar?.type === "Identifier") inner.add(s.loopvar.value);
        else for (const x of s.loopvar?.value ?? []) inner.add(x.value);
        checkBody(s.body, { ...sc, local: inner, nested: true }, false);
        checkBody(s.defaultBlock ?? [], { ...sc, local: new Set(sc.local), nested: true }, false);
        break;
      }
      case "Comment":
        break;
      case "Break":
      case "Continue":
        if (!sc.nested) throw new NotLocal("break/continue in the message loop");
        break;
      case "Macro":
      case "FilterStatement":
      case "CallStatement":
        throw new NotLocal(String(s.type));
      default:
        checkReads(s, sc);
    }
  }
  void top;
}

/** Where the message loop is, if the template is message-local; else why not. */
export function messageLocalLoop(program: { body: readonly Node[] }): MessageLoop | string {
  try {
    const body = program.body;
    const names = ["messages"];
    for (const s of body) {
      if (s.type === "Set" && s.assignee?.type === "Identifier" && s.value?.type === "Identifier" && s.value.value === "messages") names.push(s.assignee.value);
    }
    const loops = body.map((s, i) => [s, i] as const).filter(([s]) => s.type === "For" && s.iterable?.type === "Identifier" && names.includes(s.iterable.value));
    if (loops.length !== 1) return loops.length === 0 ? "no top-level loop over messages" : "more than one loop over messages";
    const [loop, at] = loops[0] as readonly [Node, number];
    if (loop.loopvar?.type !== "Identifier") return "the message loop unpacks its variable";
    if ((loop.defaultBlock ?? []).length > 0) return "the message loop has an else block";
    const everywhere = new Set<string>();
    assigned(body, everywhere);
    const forbidden = new Set([...names]);
    const inLoop = new Set<string>([loop.loopvar.value]);
    assigned(loop.body, inLoop);
    // pre and post: no messages (except the alias itself), no loop, nothing the loop assigns.
    for (const [i, s] of body.entries()) {
      if (i === at) continue;
      if (s.type === "Set" && s.value?.type === "Identifier" && s.value.value === "messages" && i < at) continue;
      const outer: Scope = { local: new Set(everywhere), assignedAnywhere: everywhere, forbidden: new Set([...forbidden, "loop", ...(i > at ? inLoop : [])]), nested: false };
      for (const n of outer.forbidden) outer.local.delete(n);
      checkBody([s], outer, true);
    }
    const sc: Scope = { local: new Set([loop.loopvar.value]), assignedAnywhere: new Set([...everywhere].filter((n) => !names.includes(n))), forbidden, nested: false };
    checkBody(loop.body, sc, true);
    return { at, iterableNames: names };
  } catch (err) {
    if (err instanceof NotLocal) return err.message;
    throw err;
  }
}
