/**
 * The error catalogue (services/routing/errors.ts) checked against the repository, in fastify's
 * manner: every code is asserted by some behavioural test, and docs/errors.md documents exactly the
 * catalogue's codes, each with its status and OpenAI `type` (no code missing, none stale). The
 * catalogue's own shape (unique codes, one status each, body shape) is checked in
 * services/routing/errors.test.ts; this file reads files, which the routing core's tests do not.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";
import { ErrorCodes, errorType } from "../services/routing/errors.js";

type Catalogue = Readonly<Record<string, { readonly status: number; readonly code: string }>>;

const ROOT = fileURLToPath(new URL("..", import.meta.url));
/** Files that name codes to check the catalogue itself, not to assert behaviour. */
const CATALOGUE_TESTS = new Set(["test/error-catalogue.test.ts", "services/routing/errors.test.ts"]);

/** Every `*.test.ts` below `dir`, outside dependencies, build output and hidden directories. */
function testFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.name.startsWith(".") || e.name === "node_modules" || e.name === "dist") continue;
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...testFiles(p));
    else if (e.isFile() && e.name.endsWith(".test.ts")) out.push(p);
  }
  return out;
}

/** The callee chain's first expression: `expect` in `expect(x).not.toBe(y)` or `expect.objectContaining(o)`. */
function rootOf(e: ts.Expression): ts.Expression {
  for (;;) {
    if (ts.isPropertyAccessExpression(e) || ts.isCallExpression(e) || ts.isElementAccessExpression(e) || ts.isNonNullExpression(e) || ts.isParenthesizedExpression(e) || ts.isAsExpression(e)) e = e.expression;
    else return e;
  }
}

/**
 * Inside an assertion: an argument, at any depth, of a call whose chain starts at `expect`
 * (`expect(e.code).toBe(c)`, `.toMatchObject({ code: c })`, `expect.objectContaining(...)`), or a
 * row of a test table (`it.each([...])`, `describe.each`, `.for`) whose test asserts its fields.
 */
function inAssertion(node: ts.Node): boolean {
  let child: ts.Node = node;
  for (let p = node.parent; p; child = p, p = p.parent) {
    if (!ts.isCallExpression(p) || !p.arguments.some((a) => a === child)) continue;
    const root = rootOf(p.expression);
    if (ts.isIdentifier(root) && root.text === "expect") return true;
    if (ts.isPropertyAccessExpression(p.expression) && (p.expression.name.text === "each" || p.expression.name.text === "for")) return true;
  }
  return false;
}

/**
 * The catalogue codes a test source asserts: a code's string literal, or `ErrorCodes.<key>`, inside
 * an assertion. Building `new RouteError(...)` outside one, or passing a code as input, does not count.
 */
function assertedCodes(source: string, catalogue: Catalogue): Set<string> {
  const codes = new Set(Object.values(catalogue).map((e) => e.code));
  const found = new Set<string>();
  const visit = (node: ts.Node): void => {
    let code: string | undefined;
    if ((ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) && codes.has(node.text)) code = node.text;
    else if (ts.isPropertyAccessExpression(node) && ts.isIdentifier(node.expression) && node.expression.text === "ErrorCodes" && Object.hasOwn(catalogue, node.name.text)) {
      code = catalogue[node.name.text]?.code;
    }
    if (code !== undefined && inAssertion(node)) found.add(code);
    ts.forEachChild(node, visit);
  };
  visit(ts.createSourceFile("test.ts", source, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS));
  return found;
}

interface DocEntry {
  where: "section" | "table row";
  code: string;
  status?: number;
  type?: string;
  line: number;
}

/**
 * docs/errors.md's entries: each `### \`code\`` section with its `- **HTTP status:** N` and
 * `- **Type:** \`t\`` lines, and each summary-table row `| \`code\` | N | \`t\` | ... |`.
 */
function parseErrorDocs(markdown: string): DocEntry[] {
  const entries: DocEntry[] = [];
  let section: DocEntry | undefined;
  markdown.split("\n").forEach((text, i) => {
    const line = i + 1;
    const heading = /^(#{1,6}) /.exec(text);
    if (heading) {
      const code = /^### `([^`]+)`\s*$/.exec(text)?.[1];
      section = code !== undefined ? { where: "section", code, line } : undefined;
      if (section) entries.push(section);
      return;
    }
    const row = /^\|\s*`([^`]+)`\s*\|\s*(\d{3})\s*\|\s*`([^`]+)`\s*\|/.exec(text);
    if (row) {
      entries.push({ where: "table row", code: row[1] as string, status: Number(row[2]), type: row[3] as string, line });
      return;
    }
    if (!section) return;
    const status = /^- \*\*HTTP status:\*\* (\d{3})\b/.exec(text)?.[1];
    if (status !== undefined) section.status = Number(status);
    const type = /^- \*\*Type:\*\* `([^`]+)`/.exec(text)?.[1];
    if (type !== undefined) section.type = type;
  });
  return entries;
}

/** What the docs get wrong about a catalogue, both ways: codes missing or repeated, stale entries, wrong status or type. */
function docProblems(catalogue: Catalogue, entries: readonly DocEntry[]): string[] {
  const problems: string[] = [];
  const byCode = new Map(Object.values(catalogue).map((e) => [e.code, e.status]));
  for (const where of ["section", "table row"] as const) {
    const mine = entries.filter((e) => e.where === where);
    for (const [code, status] of byCode) {
      const found = mine.filter((e) => e.code === code);
      if (found.length !== 1) problems.push(`${code}: ${found.length} ${where}s (expected 1)`);
      for (const e of found) {
        if (e.status !== status) problems.push(`${code}: ${where} at line ${e.line} gives status ${e.status ?? "none"}, the catalogue ${status}`);
        if (e.type !== errorType(status)) problems.push(`${code}: ${where} at line ${e.line} gives type ${e.type ?? "none"}, status ${status} gives ${errorType(status)}`);
      }
    }
    for (const e of mine) if (!byCode.has(e.code)) problems.push(`${e.code}: ${where} at line ${e.line} documents a code the catalogue does not have`);
  }
  return problems;
}

describe("error catalogue - checkers", () => {
  const fake: Catalogue = {
    alpha: { status: 400, code: "alpha_code" },
    beta: { status: 503, code: "beta_code" },
    gamma: { status: 404, code: "gamma_code" },
    delta: { status: 500, code: "delta_code" },
    eps: { status: 429, code: "eps_code" },
    zeta: { status: 502, code: "zeta_code" },
  };

  it("counts a code named inside expect(...) chains and test tables, not one merely built or passed as input", () => {
    const source = [
      'it("a", () => { expect(e.code).toBe("alpha_code"); });',
      'it.each([{ name: "b", code: "beta_code" }])("$name", ({ code }) => { expect(r.code).toBe(code); });',
      'it("c", () => { route("gamma_code"); const expected = "gamma_code"; expect(x).toBe(expected); });',
      'it("d", () => {',
      "  expect(body).toMatchObject({",
      "    error: { code: ErrorCodes.delta.code },",
      "  });",
      "});",
      'it("e", async () => { await expect(p).rejects.toEqual(expect.objectContaining({ code: `eps_code` })); });',
      'it("z", () => { const err = new RouteError("zeta", "zeta_code"); reject(err); });',
    ].join("\n");
    expect([...assertedCodes(source, fake)].sort()).toEqual(["alpha_code", "beta_code", "delta_code", "eps_code"]);
  });

  it("finds missing, repeated and stale doc entries, and wrong statuses and types", () => {
    const small: Catalogue = { alpha: { status: 400, code: "alpha_code" }, beta: { status: 503, code: "beta_code" }, gamma: { status: 404, code: "gamma_code" } };
    const md = [
      "# Errors",
      "| Code | Status | Type | When |",
      "|---|---|---|---|",
      "| `alpha_code` | 400 | `invalid_request_error` | x |",
      "| `beta_code` | 503 | `api_error` | x |",
      "| `gamma_code` | 404 | `invalid_request_error` | x |",
      "## Codes",
      "### `alpha_code`",
      "- **HTTP status:** 400",
      "- **Type:** `invalid_request_error`",
      "### `beta_code`",
      "- **HTTP status:** 500",
      "- **Type:** `overloaded_error`",
      "### `beta_code`",
      "- **HTTP status:** 503",
      "- **Type:** `overloaded_error`",
      "### `old_code`",
      "- **HTTP status:** 400",
      "## Elsewhere",
      "- **HTTP status:** 999",
    ].join("\n");
    expect(docProblems(small, parseErrorDocs(md))).toEqual([
      "beta_code: 2 sections (expected 1)",
      "beta_code: section at line 11 gives status 500, the catalogue 503",
      "gamma_code: 0 sections (expected 1)",
      "old_code: section at line 17 documents a code the catalogue does not have",
      "beta_code: table row at line 5 gives type api_error, status 503 gives overloaded_error",
    ]);
  });
});

describe("error catalogue - kept honest by the repository", () => {
  it("every code is asserted by some test (through the path that raises it)", () => {
    const files = testFiles(ROOT).filter((f) => !CATALOGUE_TESTS.has(relative(ROOT, f).split("\\").join("/")));
    expect(files.length).toBeGreaterThan(10);
    const asserted = new Set<string>();
    const named = [...Object.values(ErrorCodes).map((e) => e.code), "ErrorCodes."];
    for (const f of files) {
      const source = readFileSync(f, "utf8");
      // Parsing is the slow part: only files that name a code at all.
      if (named.some((n) => source.includes(n))) for (const c of assertedCodes(source, ErrorCodes)) asserted.add(c);
    }
    const unasserted = Object.values(ErrorCodes).map((e) => e.code).filter((c) => !asserted.has(c));
    expect(unasserted).toEqual([]);
  });

  it("docs/errors.md documents every code, with its status and type, and nothing else", () => {
    const entries = parseErrorDocs(readFileSync(join(ROOT, "docs/errors.md"), "utf8"));
    expect(docProblems(ErrorCodes, entries)).toEqual([]);
  });
});
