/**
 * Where a prompt may be cut so that encoding the pieces separately gives exactly the ids of
 * encoding the whole — the ground the prefix cache (prefix-ids.ts) stands on.
 *
 * A Hugging Face tokenizer first splits its input on the added tokens that are matched in the raw
 * text (`normalized: false`), then normalises, pre-tokenises and BPE-encodes every piece between
 * them on its own. BPE merges and pre-tokenizer regexes (lookaheads included) therefore never
 * reach across such a token. Cutting right after an occurrence of one is exact provided that:
 * - the token is always matched where it occurs: no other raw-matched added token contains it or
 *   overlaps it (a longer or overlapping match would win the leftmost-longest scan instead);
 * - its match does not depend on what follows it: `rstrip` (eats following whitespace) and
 *   `single_word` (needs a word boundary after it) are off, and `lstrip` too (kept simple);
 * - no step of the pipeline depends on a piece's position in the whole input: the one such step
 *   in tokenizers today is Metaspace with `prepend_scheme: "first"`; unknown pre-tokenizer types
 *   are treated as unsafe;
 * - special tokens are not added around the pieces (chat prompts: `add_special_tokens` false).
 * Pure: works on the parsed tokenizer.json.
 */

export interface AddedTokenSpec {
  id: number;
  content: string;
  single_word?: boolean;
  lstrip?: boolean;
  rstrip?: boolean;
  normalized?: boolean;
  special?: boolean;
}

export interface SplitPlan {
  /** Tokens after whose occurrences a prompt may be cut; empty when the tokenizer allows no safe cut. */
  boundaryTokens: string[];
  /** Why there are none, when there are none. */
  unsafe?: string;
}

/** Pre-tokenizers that work on each piece alone, whatever its position. */
const PER_PIECE_PRE_TOKENIZERS = new Set([
  "ByteLevel", "Split", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits", "BertPreTokenizer",
  "UnicodeScripts", "CharDelimiterSplit", "FixedLength",
]);

function preTokenizerProblem(p: unknown): string | undefined {
  if (p === null || p === undefined) return undefined;
  const type = (p as { type?: unknown }).type;
  if (type === "Sequence") {
    for (const inner of ((p as { pretokenizers?: unknown[] }).pretokenizers ?? [])) {
      const problem = preTokenizerProblem(inner);
      if (problem) return problem;
    }
    return undefined;
  }
  if (type === "Metaspace") {
    const scheme = (p as { prepend_scheme?: unknown }).prepend_scheme;
    return scheme === "first" ? "Metaspace pre-tokenizer with prepend_scheme \"first\" depends on the piece's position" : undefined;
  }
  if (typeof type === "string" && PER_PIECE_PRE_TOKENIZERS.has(type)) return undefined;
  return `pre-tokenizer ${JSON.stringify(type)} is not known to be position independent`;
}

function overlaps(a: string, b: string): boolean {
  // A proper suffix of `a` that is a proper prefix of `b`.
  for (let n = 1; n < Math.min(a.length, b.length); n++) if (a.endsWith(b.slice(0, n))) return true;
  return false;
}

export function planSplits(tokenizerJson: { added_tokens?: readonly AddedTokenSpec[]; pre_tokenizer?: unknown }): SplitPlan {
  const problem = preTokenizerProblem(tokenizerJson.pre_tokenizer);
  if (problem) return { boundaryTokens: [], unsafe: problem };
  const raw = (tokenizerJson.added_tokens ?? []).filter((t) => !t.normalized && t.content.length > 0);
  const boundaryTokens = raw
    .filter((t) => !t.lstrip && !t.rstrip && !t.single_word)
    .filter((t) => raw.every((o) => o.content === t.content || (!o.content.includes(t.content) && !overlaps(o.content, t.content) && !overlaps(t.content, o.content))))
    .map((t) => t.content);
  return boundaryTokens.length > 0 ? { boundaryTokens } : { boundaryTokens: [], unsafe: "no added token is a safe cut point" };
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/** Finds the cut points (end offsets of boundary-token occurrences) in a text. */
export class SplitPoints {
  private readonly re: RegExp | undefined;
  /** When every boundary token starts with the same character: scan for it, then match there (sticky). */
  private readonly first: string | undefined;
  private readonly sticky: RegExp | undefined;
  /** The longest boundary token's length. */
  private readonly maxLength: number;

  constructor(readonly plan: SplitPlan) {
    const tokens = [...plan.boundaryTokens].sort((a, b) => b.length - a.length);
    const alternatives = tokens.map(escapeRegExp).join("|");
    this.re = tokens.length > 0 ? new RegExp(alternatives, "g") : undefined;
    this.maxLength = tokens[0]?.length ?? 0;
    const c = tokens[0]?.[0];
    // A regex of hundreds of alternatives (Llama-3's reserved tokens) tries them at every position
    // of a long prompt; `indexOf` of their common first character skips the text between them.
    if (c !== undefined && tokens.every((t) => t[0] === c)) {
      this.first = c;
      this.sticky = new RegExp(alternatives, "y");
    }
  }

  get enabled(): boolean {
    return this.re !== undefined;
  }

  /**
   * End offsets (UTF-16) of the boundary tokens in `text` that end at or after `from`, ascending
   * (all of them by default), at most `max`. Occurrences of boundary tokens never overlap (no
   * boundary token contains, or overlaps the end of, another: planSplits), so a scan that starts
   * anywhere finds exactly the occurrences starting there or later; it starts one token length
   * before `from` so that a token ending at or after `from` is found whole.
   */
  of(text: string, from = 0, max = Number.POSITIVE_INFINITY): number[] {
    if (!this.re) return [];
    const out: number[] = [];
    const start = Math.max(0, from - this.maxLength);
    if (this.first !== undefined && this.sticky) {
      // Leftmost-longest as the global regex: matches cannot overlap, so scanning resumes after each.
      const re = this.sticky;
      for (let i = text.indexOf(this.first, start); i >= 0 && out.length < max; ) {
        re.lastIndex = i;
        const m = re.exec(text);
        if (m) {
          const end = i + m[0].length;
          if (end >= from) out.push(end);
          i = text.indexOf(this.first, end);
        } else i = text.indexOf(this.first, i + 1);
      }
      return out;
    }
    this.re.lastIndex = start;
    for (let m = this.re.exec(text); m && out.length < max; m = this.re.exec(text)) {
      const end = m.index + m[0].length;
      if (end >= from) out.push(end);
    }
    return out;
  }
}
