/**
 * The semantic router's two heavy libraries, loaded on first use instead of at import: the
 * language detector (eld's small dictionary, ~0.7 s of start-up CPU) and RE2 compiled to
 * WebAssembly (~0.15 s). Every process that imports the routing core (gateway, simulator, replay,
 * `jetroute config`) used to pay both at start whether or not a semantic rule used them; now only
 * a process whose rules have a language or regex signal does, once, when those rules compile.
 * Loading is synchronous (`require` of the ES module, Node >= 20.19), so the pure functions that
 * use them stay synchronous.
 */
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const requireHere = createRequire(import.meta.url);

export interface LanguageDetector {
  detect(text: string): { language: string };
}

export type Re2Constructor = new (pattern: string, flags: string) => { test(text: string): boolean; lastIndex: number };

let detector: LanguageDetector | undefined;
let re2: Re2Constructor | undefined;

/** eld's detector with its small dictionary (the package exports it to `import` only: resolved, then required). */
export function languageDetector(): LanguageDetector {
  if (detector === undefined) {
    const mod = requireHere(fileURLToPath(import.meta.resolve("eld/small"))) as { eld: LanguageDetector };
    detector = mod.eld;
  }
  return detector;
}

/** re2-wasm's RE2 class. */
export function re2Class(): Re2Constructor {
  if (re2 === undefined) re2 = (requireHere("re2-wasm") as { RE2: Re2Constructor }).RE2;
  return re2;
}
