/**
 * The patch formats kubectl sends (`kubectl apply`, `label`, `annotate`, `patch`). Pure.
 * - JSON merge patch (RFC 7386): objects merge, `null` deletes, anything else replaces.
 * - Strategic merge patch: applied as a merge patch after dropping its `$`-directives (lists are
 *   replaced, not merged by key) — enough for the metadata, labels, annotations and status a
 *   pod-watcher reads; container lists are immutable on a pod anyway.
 * - JSON patch (RFC 6902): add, replace, remove, test on `/`-paths.
 */
export class PatchError extends Error {
  override name = "PatchError";
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const isObject = (v: unknown): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);

export function mergePatch(target: unknown, patch: unknown): Json {
  if (!isObject(patch)) return structuredClone(patch as Json);
  const out: Record<string, Json> = isObject(target) ? structuredClone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** Drops strategic-merge directives (`$patch`, `$setElementOrder/...`, `$retainKeys`, ...). */
export function stripDirectives(patch: unknown): unknown {
  if (Array.isArray(patch)) return patch.map(stripDirectives);
  if (!isObject(patch)) return patch;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(patch)) if (!k.startsWith("$")) out[k] = stripDirectives(v);
  return out;
}

const unescapePointer = (t: string) => t.replace(/~1/g, "/").replace(/~0/g, "~");

export function jsonPatch(target: unknown, ops: unknown): Json {
  if (!Array.isArray(ops)) throw new PatchError("a JSON patch is an array of operations");
  let doc = structuredClone(target as Json);
  for (const op of ops as Array<{ op?: string; path?: string; value?: Json }>) {
    if (typeof op?.path !== "string" || !op.path.startsWith("/")) throw new PatchError(`bad JSON patch path ${JSON.stringify(op?.path)}`);
    const parts = op.path.slice(1).split("/").map(unescapePointer);
    const last = parts.pop() as string;
    let parent: Json = doc;
    for (const p of parts) {
      const next: Json | undefined = Array.isArray(parent) ? parent[Number(p)] : isObject(parent) ? parent[p] : undefined;
      if (next === undefined) throw new PatchError(`path ${op.path} does not exist`);
      parent = next;
    }
    const set = (v: Json) => {
      if (Array.isArray(parent)) {
        if (last === "-") parent.push(v);
        else parent.splice(Number(last), op.op === "add" ? 0 : 1, v);
      } else if (isObject(parent)) parent[last] = v;
      else throw new PatchError(`path ${op.path} does not exist`);
    };
    switch (op.op) {
      case "add":
      case "replace":
        if (op.path === "/") doc = structuredClone(op.value as Json);
        else set(structuredClone(op.value as Json));
        break;
      case "remove":
        if (Array.isArray(parent)) parent.splice(Number(last), 1);
        else if (isObject(parent) && last in parent) delete parent[last];
        else throw new PatchError(`path ${op.path} does not exist`);
        break;
      case "test": {
        const have = Array.isArray(parent) ? parent[Number(last)] : isObject(parent) ? parent[last] : undefined;
        if (JSON.stringify(have) !== JSON.stringify(op.value)) throw new PatchError(`test failed at ${op.path}`);
        break;
      }
      default:
        throw new PatchError(`unsupported JSON patch op ${JSON.stringify(op.op)}`);
    }
  }
  return doc;
}
