/**
 * Tools and tool calls as vLLM hands them to a chat template, and the JSON a JavaScript renderer
 * cannot reproduce exactly. Pure.
 *
 * vLLM renders `[tool.model_dump() for tool in request.tools]`: pydantic puts the declared fields
 * first, in declaration order, defaults filled in (`type`, then `function` = `name`, `description`
 * or null, `parameters` or null), and extra fields after them. Assistant tool-call `arguments` are
 * parsed from their JSON string; empty or missing ones become `{}`.
 *
 * Python prints the parsed JSON back (`tojson`) differently from JavaScript in three cases, and a
 * request showing any of them must not be tokenized here (the caller falls back):
 * - a float written with a fraction or exponent that Python's `repr` prints differently from
 *   JavaScript's `String` (`20.0` is `20.0` in Python, `20` here; `1e-05` vs `0.00001`);
 * - integer-like object keys (`"1"`, `"20"`): JavaScript objects list them first, in numeric order;
 * - integers beyond 2^53, which JavaScript rounds.
 * Parsed values hide the first case for integer-valued floats (`20.0` is already `20`), so the raw
 * request text is checked when the caller has it (`rawToolJsonInexact`).
 */

export class InexactToolJsonError extends Error {
  override name = "InexactToolJsonError";
}

const INDEX_KEY = /^(0|[1-9][0-9]*)$/;

function isIndexKey(k: string): boolean {
  return INDEX_KEY.test(k) && Number(k) < 2 ** 32 - 1;
}

/** CPython's `repr` of a finite float (what `json.dumps` writes for a Python float). */
export function pythonFloatRepr(x: number): string {
  if (Object.is(x, -0)) return "-0.0";
  const [mantissa, expText] = x.toExponential().split("e") as [string, string];
  const exp = Number(expText);
  if (exp < -4 || exp >= 16) return `${mantissa}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  const s = String(x);
  return Number.isInteger(x) ? `${s}.0` : s;
}

/** Why a number literal (as written in JSON) would print differently after a JavaScript parse, or undefined. */
function literalProblem(lit: string): string | undefined {
  const x = Number(lit);
  if (!Number.isFinite(x)) return `number ${lit.slice(0, 32)} out of range`;
  if (/[.eE]/.test(lit)) return pythonFloatRepr(x) === String(x) ? undefined : `float ${lit.slice(0, 32)} prints as ${String(x)} here`;
  return Number.isSafeInteger(x) ? undefined : `integer ${lit.slice(0, 32)} beyond 2^53`;
}

/** Why a parsed value would print differently from Python's parse of the same JSON, or undefined (integer-valued floats are invisible here). */
export function parsedJsonProblem(v: unknown, depth = 0): string | undefined {
  if (depth > 64) return "JSON nested too deeply";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return Number.isSafeInteger(v) ? undefined : `integer ${v} beyond 2^53`;
    return pythonFloatRepr(v) === String(v) ? undefined : `float ${v} prints differently in Python`;
  }
  if (Array.isArray(v)) {
    for (const x of v) {
      const p = parsedJsonProblem(x, depth + 1);
      if (p) return p;
    }
    return undefined;
  }
  if (v && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) {
      if (isIndexKey(k)) return `integer-like key ${JSON.stringify(k.slice(0, 32))} (reordered by JavaScript)`;
      const p = parsedJsonProblem(x, depth + 1);
      if (p) return p;
    }
  }
  return undefined;
}

/**
 * A minimal JSON scanner over raw text that reports the first number literal or key that would
 * not survive a JavaScript parse, inside the parts `inScope` selects by path. Returns undefined
 * for text that is fine or not JSON (the request parser reports that).
 */
function scanRaw(text: string, inScope: (path: readonly (string | number)[]) => boolean): string | undefined {
  let i = 0;
  const ws = () => {
    while (i < text.length && (text[i] === " " || text[i] === "\n" || text[i] === "\r" || text[i] === "\t")) i++;
  };
  const str = (): string => {
    const start = i;
    i++;
    let escaped = false;
    while (i < text.length && text.charCodeAt(i) !== 34) {
      if (text.charCodeAt(i) === 92) {
        escaped = true;
        i += 2;
      } else i++;
    }
    i++;
    // Keys are short and rarely escaped: sliced, not parsed.
    return escaped ? (JSON.parse(text.slice(start, i)) as string) : text.slice(start + 1, i - 1);
  };
  // A string whose value is not needed (message content: most of a long chat's body): found by
  // indexOf, not walked character by character, and not decoded.
  const skipStr = () => {
    let q = text.indexOf('"', i + 1);
    for (;;) {
      if (q < 0) throw new Error("not JSON");
      let b = q - 1;
      while (text.charCodeAt(b) === 92) b--;
      if ((q - 1 - b) % 2 === 0) break;
      q = text.indexOf('"', q + 1);
    }
    i = q + 1;
  };
  const value = (path: (string | number)[], scoped: boolean, depth: number): string | undefined => {
    if (depth > 128) throw new Error("deep");
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      ws();
      if (text[i] === "}") {
        i++;
        return undefined;
      }
      for (;;) {
        ws();
        const key = str();
        if (scoped && isIndexKey(key)) return `integer-like key ${JSON.stringify(key.slice(0, 32))} (reordered by JavaScript)`;
        ws();
        i++; // ':'
        path.push(key);
        const p = value(path, scoped || inScope(path), depth + 1);
        path.pop();
        if (p) return p;
        ws();
        if (text[i++] === "}") return undefined;
      }
    }
    if (c === "[") {
      i++;
      ws();
      if (text[i] === "]") {
        i++;
        return undefined;
      }
      for (let n = 0; ; n++) {
        path.push(n);
        const p = value(path, scoped || inScope(path), depth + 1);
        path.pop();
        if (p) return p;
        ws();
        if (text[i++] === "]") return undefined;
      }
    }
    if (c === '"') {
      if (!(scoped && path[path.length - 1] === "arguments")) {
        skipStr();
        return undefined;
      }
      const s = str();
      // A tool call's `arguments` is JSON inside a string: the template sees it parsed.
      if (scoped && path[path.length - 1] === "arguments" && s.trim() !== "") {
        try {
          return rawJsonProblem(s);
        } catch {
          return undefined;
        }
      }
      return undefined;
    }
    const m = /^-?[0-9][0-9]*(\.[0-9]+)?([eE][+-]?[0-9]+)?|^(true|false|null)/.exec(text.slice(i, i + 400));
    if (!m) throw new Error("not JSON");
    i += m[0].length;
    return scoped && m[3] === undefined ? literalProblem(m[0]) : undefined;
  };
  try {
    return value([], inScope([]), 0);
  } catch {
    return undefined;
  }
}

/** The first problem anywhere in a JSON text (a tool call's arguments string). */
export function rawJsonProblem(text: string): string | undefined {
  return scanRaw(text, () => true);
}

/** The first problem in a raw chat request body's `tools` and `messages[].tool_calls`, or undefined. */
export function rawToolJsonInexact(body: string): string | undefined {
  return scanRaw(body, (p) => (p.length === 1 && p[0] === "tools") || (p.length === 3 && p[0] === "messages" && p[2] === "tool_calls"));
}

/**
 * Whether a chat body parsed into these `tools` and `messages` needs its raw text scanned
 * (`rawToolJsonInexact`, a second walk of the whole body after its parse). Only a literal that the
 * parse changed out of sight needs the raw text: a float with an integer value (`20.0`, `1e5`), an
 * integer beyond 2^53, a number out of range — each parses to an integer or an infinity, which this
 * looks for in the parsed scope. Whatever else a raw scan reports is reported from the parse too:
 * other floats and integer-like keys by `parsedJsonProblem` on the tools and tool calls, and an
 * assistant tool call's `arguments` string by the template's normalisation, which scans it as raw
 * JSON (`normaliseToolCalls`). Conservatively true for shapes those do not cover: `tools` that is
 * not a list, tool calls on a message that is not an assistant's, another string under an
 * `arguments` key, nesting past 64 levels. (One difference, in the body's favour: a duplicated key
 * whose first value a scan would flag, where Python's parse, like JavaScript's, keeps the last.)
 */
export function rawToolJsonScanNeeded(tools: unknown, messages: readonly unknown[]): boolean {
  if (tools !== undefined && tools !== null && !Array.isArray(tools)) return true;
  if (hidesLiteral(tools, 0)) return true;
  for (const m of messages) {
    if (!isObject(m) || m.tool_calls === undefined || m.tool_calls === null) continue;
    if (m.role !== "assistant" || !Array.isArray(m.tool_calls)) return true;
    for (const call of m.tool_calls) {
      if (!isObject(call)) {
        if (hidesLiteral(call, 1)) return true;
        continue;
      }
      for (const [k, v] of Object.entries(call)) {
        if (k !== "function" || !isObject(v)) {
          if (hidesLiteral(v, 2, k)) return true;
          continue;
        }
        // The call's own `arguments` string is scanned by the normalisation.
        for (const [fk, fv] of Object.entries(v)) if (!(fk === "arguments" && typeof fv === "string") && hidesLiteral(fv, 3, fk)) return true;
      }
    }
  }
  return false;
}

/** Whether a parsed value holds a number the parse may have changed unseen (an integer or non-finite value), a string a raw scan would read as JSON (under an `arguments` key), or nests too deeply to tell. */
function hidesLiteral(v: unknown, depth: number, key?: string): boolean {
  if (depth > 64) return true;
  if (typeof v === "number") return Number.isInteger(v) || !Number.isFinite(v);
  if (typeof v === "string") return key === "arguments";
  if (Array.isArray(v)) {
    for (const x of v) if (hidesLiteral(x, depth + 1)) return true;
    return false;
  }
  if (v && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) if (hidesLiteral(x, depth + 1, k)) return true;
  }
  return false;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return !!v && typeof v === "object" && !Array.isArray(v);
}

/** One OpenAI tool as vLLM's `ChatCompletionToolsParam.model_dump()` gives it to the template. */
export function normaliseTool(tool: unknown): Record<string, unknown> {
  if (!isObject(tool) || !isObject(tool.function) || typeof tool.function.name !== "string") throw new InexactToolJsonError("a tool needs a function with a string name");
  const { type, function: fn, ...extraTool } = tool;
  const { name, description, parameters, ...extraFn } = fn;
  return {
    type: type ?? "function",
    function: { name, description: description ?? null, parameters: parameters ?? null, ...extraFn },
    ...extraTool,
  };
}

/**
 * Assistant tool calls as vLLM passes them: `arguments` parsed from JSON, empty or missing as `{}`.
 * `exact`: refuse arguments whose numbers or keys a JavaScript parse changes (InexactToolJsonError).
 */
export function normaliseToolCalls(calls: unknown, exact = true): unknown {
  if (!Array.isArray(calls)) return calls;
  return calls.map((call) => {
    if (!isObject(call) || !isObject(call.function)) return call;
    const args = call.function.arguments;
    let parsed: unknown;
    if (args === undefined || args === null || args === "") parsed = {};
    else if (typeof args === "string") {
      const problem = exact ? rawJsonProblem(args) : undefined;
      if (problem) throw new InexactToolJsonError(`tool call arguments: ${problem}`);
      try {
        parsed = JSON.parse(args);
      } catch {
        // vLLM's json.loads raises: the engine refuses the request.
        throw new InexactToolJsonError("tool call arguments are not JSON");
      }
    } else parsed = args;
    return { ...call, function: { ...call.function, arguments: parsed } };
  });
}
