/**
 * Which chat templates can render a later turn from the previous turn's pieces although their
 * message loop looks beyond its own message (Qwen3's looks at the last user query's position, at
 * its neighbours' roles and at whether a message is the last): a check of the template's syntax
 * tree (@huggingface/jinja's) that finds, in the loop body, every *context read* — each maximal
 * expression that reads neither the loop variable nor a name the body binds (so: `loop.last`,
 * `loop.index0 > ns.last_query_index`, `messages[loop.index0 + 1].role`, `tools`). Pure.
 *
 * What the body writes is visible only inside one iteration (no attribute assignment: no namespace
 * carried across iterations or into what follows), so the piece one iteration writes is a function
 * of its message, the values of the context reads it evaluated (in order), and nothing else —
 * which is what window-render.ts relies on: it records those values per piece and reuses a piece
 * when its message is the same and re-evaluating its recorded reads on the new conversation gives
 * the same values. A read of a body-bound name that an earlier iteration (not this one) set is
 * caught while rendering (the piece is then not cached: the render falls back to the full path).
 *
 * Refused (the template renders whole): no single top-level `for … in messages`, a tuple loop
 * variable, an `else` block on that loop, `break`/`continue` directly in it, attribute
 * assignment (`set ns.x`) in it, `messages` reassigned anywhere, macros, call/filter blocks, and
 * `strftime_now` called with arguments that depend on the message (its value would escape the
 * check), and expression kinds this check does not know.
 */

// biome-ignore lint/suspicious/noExplicitAny: the parser's node classes are not exported; nodes are read by their `type`.
type Node = any;

export interface WindowLoop {
  /** Index of the message loop in the program's top-level body. */
  at: number;
  loopvar: string;
  /** The loop body's context reads (AST nodes, by identity). */
  tracked: Set<Node>;
  /** Names the loop body binds (its variable, `set` targets, nested loop variables). */
  locals: Set<string>;
}

class NotWindowable extends Error {}

interface Walk {
  locals: Set<string>;
  tracked: Set<Node>;
}

/** Sub-expressions that are evaluated as expressions (filter, test and attribute names are not variables). */
function children(e: Node): Node[] {
  switch (e.type) {
    case "Identifier":
    case "StringLiteral":
    case "IntegerLiteral":
    case "FloatLiteral":
    case "BooleanLiteral":
    case "NullLiteral":
      return [];
    case "ArrayLiteral":
    case "TupleLiteral":
      return e.value;
    case "ObjectLiteral":
      return [...(e.value as Map<Node, Node>)].flat();
    case "MemberExpression":
      return e.computed ? [e.object, e.property] : [e.object];
    case "CallExpression":
      return [e.callee, ...e.args];
    case "BinaryExpression":
      return [e.left, e.right];
    case "FilterExpression":
      return [e.operand, ...(e.filter?.type === "CallExpression" ? e.filter.args : [])];
    case "TestExpression":
      return [e.operand];
    case "UnaryExpression":
    case "SpreadExpression":
    case "KeywordSpreadExpression":
      return [e.argument];
    case "SliceExpression":
      return [e.start, e.stop, e.step].filter((x) => x);
    case "KeywordArgumentExpression":
      return [e.value];
    case "Ternary":
      return [e.condition, e.trueExpr, e.falseExpr];
    case "SelectExpression":
      return [e.lhs, e.test];
    default:
      throw new NotWindowable(`expression ${String(e.type)}`);
  }
}

/** Whether `e` is a context read (`vars`: it reads some variable); records maximal context reads below a non-context node. */
function classify(e: Node, w: Walk, nested: boolean): { ctx: boolean; vars: boolean } {
  if (e.type === "Identifier") {
    const local = w.locals.has(e.value) || (e.value === "loop" && nested);
    return { ctx: !local, vars: true };
  }
  const kids = children(e);
  const infos = kids.map((k) => classify(k, w, nested));
  if (infos.every((i) => i.ctx)) return { ctx: true, vars: infos.some((i) => i.vars) };
  if (e.type === "CallExpression" && e.callee?.type === "Identifier" && e.callee.value === "strftime_now") throw new NotWindowable("strftime_now with message-dependent arguments");
  kids.forEach((k, i) => {
    if (infos[i]?.ctx && infos[i]?.vars) w.tracked.add(k);
  });
  return { ctx: false, vars: true };
}

function root(e: Node, w: Walk, nested: boolean): void {
  if (!e) return;
  const i = classify(e, w, nested);
  if (i.ctx && i.vars) w.tracked.add(e);
}

/** Names bound in the loop body: `set` targets and nested loop variables. */
function bound(stmts: readonly Node[], out: Set<string>): void {
  for (const s of stmts) {
    if (s.type === "Set") {
      if (s.assignee?.type === "Identifier") out.add(s.assignee.value);
      else if (s.assignee?.type === "TupleLiteral" && s.assignee.value.every((x: Node) => x.type === "Identifier")) for (const x of s.assignee.value) out.add(x.value);
      else throw new NotWindowable("attribute assignment in the message loop");
      bound(s.body ?? [], out);
    } else if (s.type === "For") {
      if (s.loopvar?.type === "Identifier") out.add(s.loopvar.value);
      else for (const x of s.loopvar?.value ?? []) out.add(x.value);
      bound(s.body, out);
    } else if (s.type === "If") {
      bound(s.body, out);
      bound(s.alternate, out);
    }
  }
}

function walkBody(stmts: readonly Node[], w: Walk, nested: boolean): void {
  for (const s of stmts) {
    switch (s.type) {
      case "Set":
        root(s.value, w, nested);
        walkBody(s.body ?? [], w, nested);
        break;
      case "If":
        root(s.test, w, nested);
        walkBody(s.body, w, nested);
        walkBody(s.alternate, w, nested);
        break;
      case "For":
        // An else block runs where the nested `loop` is not bound (it would read the message loop's).
        if ((s.defaultBlock ?? []).length > 0) throw new NotWindowable("a nested loop with an else block");
        root(s.iterable, w, nested);
        walkBody(s.body, w, true);
        break;
      case "Comment":
        break;
      case "Break":
      case "Continue":
        if (!nested) throw new NotWindowable("break/continue in the message loop");
        break;
      case "Macro":
      case "FilterStatement":
      case "CallStatement":
        throw new NotWindowable(String(s.type));
      default:
        root(s, w, nested);
    }
  }
}

/** Every statement of the program, nested ones included. */
function* statements(stmts: readonly Node[]): Generator<Node> {
  for (const s of stmts) {
    yield s;
    for (const k of ["body", "alternate", "defaultBlock"]) if (Array.isArray(s[k])) yield* statements(s[k]);
  }
}

/** Where the message loop is and what its body reads of the context, or why the template does not qualify. */
export function windowLoop(program: { body: readonly Node[] }): WindowLoop | string {
  try {
    const body = program.body;
    for (const s of statements(body)) {
      if (s.type === "Macro") return "macro";
      if (s.type === "Set" && s.assignee?.type === "Identifier" && s.assignee.value === "messages") return "reassigns messages";
      if (s.type === "Set" && s.assignee?.type === "TupleLiteral" && s.assignee.value.some((x: Node) => x.value === "messages")) return "reassigns messages";
    }
    const loops = body.map((s, i) => [s, i] as const).filter(([s]) => s.type === "For" && s.iterable?.type === "Identifier" && s.iterable.value === "messages");
    if (loops.length !== 1) return loops.length === 0 ? "no top-level loop over messages" : "more than one loop over messages";
    const [loop, at] = loops[0] as readonly [Node, number];
    if (loop.loopvar?.type !== "Identifier" || loop.loopvar.value === "loop") return "the message loop unpacks its variable";
    if ((loop.defaultBlock ?? []).length > 0) return "the message loop has an else block";
    const locals = new Set<string>([loop.loopvar.value]);
    bound(loop.body, locals);
    const w: Walk = { locals, tracked: new Set() };
    walkBody(loop.body, w, false);
    return { at, loopvar: loop.loopvar.value, tracked: w.tracked, locals };
  } catch (err) {
    if (err instanceof NotWindowable) return err.message;
    throw err;
  }
}
