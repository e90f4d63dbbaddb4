#!/usr/bin/env node
// Writes test/file-durations.json from a vitest JSON report (`npm test -- --reporter=json
// --outputFile.json=report.json`): each test file's wall seconds, which test/sequencer.ts uses to
// start the longest files first. Refresh it when files are added or their time changes a lot.
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const report = process.argv[2];
if (!report) {
  console.error("usage: node scripts/test-durations.mjs <vitest-report.json>");
  process.exit(2);
}
const r = JSON.parse(readFileSync(report, "utf8"));
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const out = {};
for (const f of r.testResults) {
  // The report names files by absolute path in the clone that ran; keep the repository path.
  const m = f.name.match(/(?:^|\/)((?:services|streams|schemas|test|loadtest|deploy)\/.*\.test\.ts)$/);
  if (!m) continue;
  out[m[1]] = Math.round((f.endTime - f.startTime) / 100) / 10;
}
const sorted = Object.fromEntries(Object.entries(out).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)));
writeFileSync(path.join(root, "test/file-durations.json"), `${JSON.stringify(sorted, null, 1)}\n`);
console.log(`${Object.keys(sorted).length} files written to test/file-durations.json`);
