/**
 * The resources the stand-in serves, described as data: the two built-in kinds a watcher needs
 * (pods, leases) and custom resources, served generically the way the API server serves a
 * CustomResourceDefinition's kind — discovery entries, list/watch/get/create/replace/patch/delete,
 * and (with `statusSubresource`) a `/status` subresource that alone may change `status`.
 *
 * The custom resources served by default are the Gateway API Inference Extension's kinds
 * (docs/inference-pool.md): InferencePool `inference.networking.k8s.io/v1` (the GA API), and the
 * endpoint picker's InferenceObjective / InferenceModelRewrite in both groups they have been
 * published under, `llm-d.ai/v1alpha2` (the llm-d router, where these APIs moved in 2026) and
 * `inference.networking.x-k8s.io/v1alpha2` (the Inference Extension before the split).
 */

export interface ResourceDef {
  /** The store's key for the resource: `pods` and `leases` for the built-ins, `<plural>.<group>` otherwise. */
  readonly id: string;
  /** "" for the core group. */
  readonly group: string;
  readonly version: string;
  readonly plural: string;
  readonly singular: string;
  readonly kind: string;
  readonly listKind: string;
  readonly shortNames?: readonly string[];
  readonly categories?: readonly string[];
  /** Writes to the object leave `status` alone; only `<name>/status` changes it (and create drops it). */
  readonly statusSubresource: boolean;
  /** A `<name>/scale` subresource (autoscaling/v1 Scale over `spec.replicas`), as Deployments have. */
  readonly scaleSubresource?: boolean;
}

/** `apiVersion` of a resource's objects: `v1` for the core group, `<group>/<version>` otherwise. */
export const apiVersionOf = (d: Pick<ResourceDef, "group" | "version">): string => (d.group ? `${d.group}/${d.version}` : d.version);

export const POD_RESOURCE: ResourceDef = {
  id: "pods", group: "", version: "v1", plural: "pods", singular: "pod", kind: "Pod", listKind: "PodList", shortNames: ["po"], categories: ["all"], statusSubresource: true,
};
export const LEASE_RESOURCE: ResourceDef = {
  id: "leases", group: "coordination.k8s.io", version: "v1", plural: "leases", singular: "lease", kind: "Lease", listKind: "LeaseList", statusSubresource: false,
};

/** apps/v1 Deployments: a ReplicaSet-like loop (deployments.ts) keeps their pods at `spec.replicas`. */
export const DEPLOYMENT_RESOURCE: ResourceDef = {
  id: "deployments.apps", group: "apps", version: "v1", plural: "deployments", singular: "deployment", kind: "Deployment", listKind: "DeploymentList", shortNames: ["deploy"], categories: ["all"], statusSubresource: true, scaleSubresource: true,
};

/** A custom resource definition's kind as the stand-in serves it. */
export function customResource(group: string, version: string, kind: string, o: { plural?: string; shortNames?: string[]; statusSubresource?: boolean } = {}): ResourceDef {
  const plural = o.plural ?? `${kind.toLowerCase()}s`;
  return {
    id: `${plural}.${group}`, group, version, plural, singular: kind.toLowerCase(), kind, listKind: `${kind}List`,
    ...(o.shortNames ? { shortNames: o.shortNames } : {}), statusSubresource: o.statusSubresource ?? true,
  };
}

export const INFERENCE_POOL_GROUP = "inference.networking.k8s.io";
/** The groups InferenceObjective and InferenceModelRewrite have been published under (newest first). */
export const OBJECTIVE_GROUPS = ["llm-d.ai", "inference.networking.x-k8s.io"] as const;

export const INFERENCE_RESOURCES: readonly ResourceDef[] = [
  customResource(INFERENCE_POOL_GROUP, "v1", "InferencePool", { shortNames: ["infpool"] }),
  ...OBJECTIVE_GROUPS.flatMap((g) => [customResource(g, "v1alpha2", "InferenceObjective"), customResource(g, "v1alpha2", "InferenceModelRewrite")]),
];

/** AIBrix's ModelAdapter (`model.aibrix.ai/v1alpha1`): LoRA adapters `jetroute adapter-controller` places (docs/adapters.md). */
export const MODEL_ADAPTER_RESOURCE: ResourceDef = customResource("model.aibrix.ai", "v1alpha1", "ModelAdapter", { shortNames: ["ma"] });

export const DEFAULT_RESOURCES: readonly ResourceDef[] = [POD_RESOURCE, LEASE_RESOURCE, DEPLOYMENT_RESOURCE, ...INFERENCE_RESOURCES, MODEL_ADAPTER_RESOURCE];

const VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/** The discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`) for a set of resources. */
export function discoveryDocuments(defs: readonly ResourceDef[]): Record<string, unknown> {
  const byGv = new Map<string, ResourceDef[]>();
  for (const d of defs) {
    const gv = apiVersionOf(d);
    byGv.set(gv, [...(byGv.get(gv) ?? []), d]);
  }
  const docs: Record<string, unknown> = {
    "/api": { kind: "APIVersions", versions: ["v1"], serverAddressByClientCIDRs: [{ clientCIDR: "0.0.0.0/0", serverAddress: "127.0.0.1" }] },
    "/version": { major: "1", minor: "32", gitVersion: "v1.32.0-jetroute-standin", platform: "linux/amd64" },
  };
  const groups = new Map<string, string[]>();
  for (const [gv, list] of byGv) {
    const first = list[0] as ResourceDef;
    const resources = list.flatMap((d) => [
      { name: d.plural, singularName: d.singular, namespaced: true, kind: d.kind, verbs: VERBS, ...(d.shortNames ? { shortNames: d.shortNames } : {}), ...(d.categories ? { categories: d.categories } : {}) },
      ...(d.statusSubresource ? [{ name: `${d.plural}/status`, singularName: "", namespaced: true, kind: d.kind, verbs: ["get", "patch", "update"] }] : []),
      ...(d.scaleSubresource ? [{ name: `${d.plural}/scale`, singularName: "", namespaced: true, group: "autoscaling", version: "v1", kind: "Scale", verbs: ["get", "patch", "update"] }] : []),
    ]);
    docs[first.group ? `/apis/${gv}` : `/api/${gv}`] = { kind: "APIResourceList", apiVersion: "v1", groupVersion: gv, resources };
    if (first.group) groups.set(first.group, [...(groups.get(first.group) ?? []), first.version]);
  }
  docs["/apis"] = {
    kind: "APIGroupList", apiVersion: "v1",
    groups: [...groups].map(([name, versions]) => ({
      name,
      versions: versions.map((version) => ({ groupVersion: `${name}/${version}`, version })),
      preferredVersion: { groupVersion: `${name}/${versions[0]}`, version: versions[0] },
    })),
  };
  return docs;
}

export interface Route {
  resource: string;
  namespace?: string;
  name?: string;
  subresource?: "status" | "scale";
}

/** The resource, namespace, name and subresource a request path names, if any. */
export function routeOf(defs: ReadonlyMap<string, ResourceDef>, pathname: string): Route | undefined {
  const m = /^\/(?:api\/(v1)|apis\/([^/]+)\/([^/]+))\/(?:namespaces\/([^/]+)\/)?([^/]+)(?:\/([^/]+)(?:\/([^/]+))?)?$/.exec(pathname);
  if (!m) return undefined;
  const gv = m[1] ?? `${m[2]}/${m[3]}`;
  const def = defs.get(`${gv} ${m[5]}`);
  if (!def) return undefined;
  const sub = m[7];
  if (sub !== undefined && !((sub === "status" && def.statusSubresource) || (sub === "scale" && def.scaleSubresource))) return undefined;
  return { resource: def.id, ...(m[4] !== undefined ? { namespace: m[4] } : {}), ...(m[6] !== undefined ? { name: m[6] } : {}), ...(sub ? { subresource: sub as "status" | "scale" } : {}) };
}

/** Index for `routeOf`: `<apiVersion> <plural>` -> definition. */
export function routeIndex(defs: readonly ResourceDef[]): Map<string, ResourceDef> {
  return new Map(defs.map((d) => [`${apiVersionOf(d)} ${d.plural}`, d]));
}
