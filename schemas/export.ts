/**
 * Writes every event schema to `schemas/json/<type>.schema.json`, and every config bucket document
 * (model config, rate limits, API key record) to `schemas/json/<name>.schema.json` (JSON Schema
 * draft 2020-12 compatible), for consumers in other languages and for `nats` CLI users reading payloads.
 * `npm run schemas` regenerates them; a test fails when the committed files drift.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { CONFIG_SCHEMAS } from "./config.js";
import { EVENT_SCHEMAS } from "./events.js";

export function renderSchemas(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [type, schema] of Object.entries(EVENT_SCHEMAS)) {
    const doc = { $schema: "https://json-schema.org/draft/2020-12/schema", title: `jetroute ${type} event`, ...schema, $id: `jetroute/${type}` };
    out[`${type}.schema.json`] = `${JSON.stringify(doc, null, 2)}\n`;
  }
  for (const [name, schema] of Object.entries(CONFIG_SCHEMAS)) {
    const doc = { $schema: "https://json-schema.org/draft/2020-12/schema", title: `jetroute ${name} config`, ...schema, $id: `jetroute/${name}` };
    out[`${name}.schema.json`] = `${JSON.stringify(doc, null, 2)}\n`;
  }
  return out;
}

/** The source dir of schemas/json, whether run from schemas/ (vitest) or dist/schemas/ (node). */
export function schemaJsonDir(): string {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const root = here.includes(`${path.sep}dist${path.sep}`) ? path.resolve(here, "..", "..") : path.resolve(here, "..");
  return path.join(root, "schemas", "json");
}

if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  const dir = schemaJsonDir();
  mkdirSync(dir, { recursive: true });
  for (const [name, text] of Object.entries(renderSchemas())) writeFileSync(path.join(dir, name), text);
  console.log(`wrote ${Object.keys(renderSchemas()).length} schemas to schemas/json/`);
}
