#!/usr/bin/env node
// The compiled CLI lives in dist/ (built by `npm run build`, which `npm install` runs via `prepare`).
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
const entry = new URL("../dist/services/cli.js", import.meta.url);
if (!existsSync(fileURLToPath(entry))) {
  console.error("jetroute: dist/ is missing; run `npm run build` first");
  process.exit(1);
}
await import(entry.href);
