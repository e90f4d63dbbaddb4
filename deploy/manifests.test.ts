/**
 * Static checks of the deployment manifests: the mistakes that `kubectl apply` accepts and that
 * only show up as a broken route, a gateway that never turns Ready or a flag silently ignored.
 * Every YAML document under deploy/ is parsed; the jetroute command lines are checked against the
 * sub-commands and flags the CLI really registers (every module services/cli-commands.ts lists), and the names that tie Gateway API objects, policies, Services and probes together are
 * checked end to end.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { Command } from "commander";
import { parseAllDocuments } from "yaml";
import { CLI_COMMANDS } from "../services/cli-commands.js";
import { DEFAULT_MAX_BODY_BYTES } from "../services/gateway/extproc-server.js";
import { watcherLeaseName } from "../services/pod-watcher/kubernetes.js";
import { parsePodList } from "../services/pod-watcher/static-pods.js";

const DEPLOY = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(DEPLOY, "..");
const read = (p: string) => readFileSync(path.join(ROOT, p), "utf8");

// ---------------------------------------------------------------- tiny typed accessors
type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
function at(root: unknown, dotted: string): unknown {
  let cur: unknown = root;
  for (const key of dotted.split(".")) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Obj)[key];
  }
  return cur;
}
function obj(v: unknown, what: string): Obj {
  if (!isObj(v)) throw new Error(`${what}: expected a mapping, got ${JSON.stringify(v)}`);
  return v;
}
function list(v: unknown, what: string): unknown[] {
  if (!Array.isArray(v)) throw new Error(`${what}: expected a list, got ${JSON.stringify(v)}`);
  return v;
}
function str(v: unknown, what: string): string {
  if (typeof v !== "string") throw new Error(`${what}: expected a string, got ${JSON.stringify(v)}`);
  return v;
}
const listOrEmpty = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

/** Kubernetes quantities (4Mi, 10Gi, 512) in bytes. */
function bytes(q: unknown): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(q));
  if (!m) throw new Error(`not a quantity: ${JSON.stringify(q)}`);
  const mult: Record<string, number> = { "": 1, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(m[1]) * (mult[m[2] ?? ""] as number);
}
/** Gateway API durations (600s, 10m, 1h30m, 250ms) in seconds. */
function seconds(d: unknown): number {
  const s = String(d);
  if (!/^(\d+(h|m|s|ms))+$/.test(s)) throw new Error(`not a Gateway API duration: ${JSON.stringify(d)}`);
  let total = 0;
  for (const [, n, unit] of s.matchAll(/(\d+)(ms|h|m|s)/g)) total += Number(n) * ({ h: 3600, m: 60, s: 1, ms: 0.001 }[unit as "h" | "m" | "s" | "ms"]);
  return total;
}

// ---------------------------------------------------------------- every YAML document under deploy/
/**
 * deploy/pools/ is a kustomize overlay of the base manifests (patches, a Component): its files are
 * not objects in their own right. It is checked as `kubectl kustomize deploy/pools` renders it,
 * in "gateway pools" below.
 */
const POOLS_DIR = path.join(DEPLOY, "pools");
/** deploy/inference-pool/ (kustomize overlays too) is checked by inference-pool.test.ts as rendered. */
const INFERENCE_POOL_DIR = path.join(DEPLOY, "inference-pool");

function yamlFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) return name === "node_modules" || p === POOLS_DIR || p === INFERENCE_POOL_DIR ? [] : yamlFiles(p);
    return /\.ya?ml$/.test(name) ? [p] : [];
  });
}

/** Helm values files are configuration for a chart, not Kubernetes objects. */
const HELM_VALUES = new Set(["nats/values.yaml"]);
const isKustomization = (rel: string) => path.basename(rel) === "kustomization.yaml";

interface Doc {
  file: string;
  value: Obj;
}
const parseErrors: string[] = [];
const allDocs: Doc[] = [];
for (const abs of yamlFiles(DEPLOY)) {
  const file = path.relative(DEPLOY, abs).split(path.sep).join("/");
  for (const d of parseAllDocuments(readFileSync(abs, "utf8"))) {
    for (const e of [...d.errors, ...d.warnings]) parseErrors.push(`${file}: ${e.message}`);
    const v = d.toJS();
    if (v === null || v === undefined) continue;
    if (!isObj(v)) parseErrors.push(`${file}: a document is not a mapping`);
    else allDocs.push({ file, value: v });
  }
}
const k8s = allDocs.filter((d) => !HELM_VALUES.has(d.file) && !isKustomization(d.file));
const kinds = (kind: string) => k8s.filter((d) => d.value.kind === kind).map((d) => d.value);
const nsOf = (o: Obj) => (at(o, "metadata.namespace") as string | undefined) ?? "default";
const nameOf = (o: Obj) => str(at(o, "metadata.name"), `${String(o.kind)} metadata.name`);
function one(kind: string, name?: string, ns?: string): Obj {
  const found = kinds(kind).filter((o) => (name === undefined || nameOf(o) === name) && (ns === undefined || nsOf(o) === ns));
  if (found.length !== 1) throw new Error(`expected exactly one ${kind}${name ? ` ${ns ?? "*"}/${name}` : ""} under deploy/, found ${found.length}`);
  return found[0] as Obj;
}

/** The apiVersion each kind must use (Envoy Gateway >= 1.5, Gateway API v1). */
const API_VERSIONS: Record<string, string> = {
  CustomResourceDefinition: "apiextensions.k8s.io/v1",
  Namespace: "v1",
  ConfigMap: "v1",
  Service: "v1",
  ServiceAccount: "v1",
  Deployment: "apps/v1",
  Job: "batch/v1",
  PodDisruptionBudget: "policy/v1",
  ClusterRole: "rbac.authorization.k8s.io/v1",
  Role: "rbac.authorization.k8s.io/v1",
  RoleBinding: "rbac.authorization.k8s.io/v1",
  ClusterRoleBinding: "rbac.authorization.k8s.io/v1",
  GatewayClass: "gateway.networking.k8s.io/v1",
  Gateway: "gateway.networking.k8s.io/v1",
  HTTPRoute: "gateway.networking.k8s.io/v1",
  ReferenceGrant: "gateway.networking.k8s.io/v1beta1",
  EnvoyProxy: "gateway.envoyproxy.io/v1alpha1",
  EnvoyExtensionPolicy: "gateway.envoyproxy.io/v1alpha1",
  BackendTrafficPolicy: "gateway.envoyproxy.io/v1alpha1",
  ClientTrafficPolicy: "gateway.envoyproxy.io/v1alpha1",
  EnvoyPatchPolicy: "gateway.envoyproxy.io/v1alpha1",
  ServiceMonitor: "monitoring.coreos.com/v1",
  NetworkPolicy: "networking.k8s.io/v1",
};
const CLUSTER_SCOPED = new Set(["Namespace", "ClusterRole", "ClusterRoleBinding", "GatewayClass", "CustomResourceDefinition"]);

// ---------------------------------------------------------------- the CLI as the code defines it
interface Flag {
  takesValue: boolean;
  required: boolean;
}
interface SubCommand {
  file: string;
  children: string[];
  /** Every flag the file registers (for a command with children: all of theirs). */
  flags: Map<string, Flag>;
  /** A child's own flags plus the ones registered before the first child (shared by all). */
  childFlags: Map<string, Map<string, Flag>>;
  /** A child's required positional arguments (`set-pool <pool>`: 1). */
  positionals: Map<string, number>;
}
/** The flags commander knows for a command (`--x <v>` takes a value, `requiredOption` is mandatory). */
function flagsOf(cmd: Command): Map<string, Flag> {
  const out = new Map<string, Flag>();
  for (const o of cmd.options) if (o.long) out.set(o.long, { takesValue: o.required || o.optional, required: o.mandatory });
  return out;
}
/**
 * The CLI as commander builds it: every sub-command module services/cli-commands.ts lists
 * registers on a fresh program, so each sub-command's flags are exactly the ones `jetroute` would
 * accept; the names the table gives a module must be the ones it registers (the CLI loads a
 * module by them).
 */
async function cliCommands(): Promise<Map<string, SubCommand>> {
  const commands = new Map<string, SubCommand>();
  for (const entry of CLI_COMMANDS) {
    const file = entry.module;
    const program = new Command("jetroute");
    (await entry.load())(program);
    const registered = program.commands.map((c) => c.name());
    if (registered.join() !== entry.names.join()) throw new Error(`${file} registers ${registered.join()}, services/cli-commands.ts says ${entry.names.join()}`);
    for (const top of program.commands) {
      const shared = flagsOf(top);
      const flags = new Map(shared);
      const childFlags = new Map<string, Map<string, Flag>>();
      const positionals = new Map<string, number>();
      for (const child of top.commands) {
        const own = flagsOf(child);
        for (const [k, v] of own) flags.set(k, v);
        childFlags.set(child.name(), new Map([...shared, ...own]));
        positionals.set(child.name(), child.registeredArguments.filter((a) => a.required).length);
      }
      commands.set(top.name(), { file, children: top.commands.map((c) => c.name()), flags, childFlags, positionals });
    }
  }
  return commands;
}
const COMMANDS = await cliCommands();

interface Invocation {
  where: string;
  sub: string;
  child?: string;
  /** A child command's positional arguments (`config set-pool chat`: ["chat"]). */
  positionals: string[];
  flags: Map<string, string | true>;
  container: Obj;
  pod: Obj;
  workload: Obj;
}
const podSpecOf = (w: Obj): Obj | undefined => {
  const spec = at(w, "spec.template.spec") ?? at(w, "spec.jobTemplate.spec.template.spec");
  return isObj(spec) ? spec : undefined;
};
const isJetrouteImage = (image: unknown) => typeof image === "string" && /(^|\/)jetroute(:|@|$)/.test(image);
/** The containers running the jetroute image, in the base manifests or in the given objects. */
function jetrouteContainers(objects: Obj[] = k8s.map((d) => d.value)): Array<{ where: string; container: Obj; pod: Obj; workload: Obj }> {
  const out: Array<{ where: string; container: Obj; pod: Obj; workload: Obj }> = [];
  for (const w of objects) {
    const pod = podSpecOf(w);
    if (!pod) continue;
    for (const c of [...listOrEmpty(pod.initContainers), ...listOrEmpty(pod.containers)]) {
      const container = obj(c, "container");
      if (isJetrouteImage(container.image)) out.push({ where: `${String(w.kind)} ${nsOf(w)}/${nameOf(w)} container ${String(container.name)}`, container, pod, workload: w });
    }
  }
  return out;
}
/** Parses a container's args the way commander would, failing on anything it would reject or ignore. */
function invocation(c: { where: string; container: Obj; pod: Obj; workload: Obj }): Invocation {
  const args = list(c.container.args, `${c.where} args`).map((a) => String(a));
  const sub = args[0] ?? "";
  const cmd = COMMANDS.get(sub);
  if (!cmd) throw new Error(`${c.where}: "${sub}" is not a jetroute sub-command (known: ${[...COMMANDS.keys()].join(", ")})`);
  let i = 1;
  let child: string | undefined;
  const positionals: string[] = [];
  let known = cmd.flags;
  if (cmd.children.length > 0) {
    child = args[1];
    if (!child || !cmd.children.includes(child)) throw new Error(`${c.where}: "${sub} ${child ?? ""}" is not a sub-command (known: ${cmd.children.join(", ")})`);
    i = 2;
    known = cmd.childFlags.get(child) ?? new Map();
    const want = cmd.positionals.get(child) ?? 0;
    for (; positionals.length < want; i++) {
      const arg = args[i];
      if (arg === undefined || arg.startsWith("--")) throw new Error(`${c.where}: \`jetroute ${sub} ${child}\` needs ${want} positional argument(s)`);
      positionals.push(arg);
    }
  }
  const flags = new Map<string, string | true>();
  for (; i < args.length; i++) {
    const arg = args[i] as string;
    if (!arg.startsWith("--")) throw new Error(`${c.where}: unexpected positional argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg : arg.slice(0, eq);
    const flag = known.get(name);
    if (!flag) throw new Error(`${c.where}: ${name} is not a flag of \`jetroute ${sub}${child ? ` ${child}` : ""}\` (${cmd.file})`);
    let value: string | true = true;
    if (eq >= 0) value = arg.slice(eq + 1);
    else if (flag.takesValue) {
      const next = args[i + 1];
      if (next === undefined || next.startsWith("--")) throw new Error(`${c.where}: ${name} needs a value`);
      value = next;
      i++;
    }
    if (flag.takesValue && (value === true || value === "")) throw new Error(`${c.where}: ${name} needs a value`);
    if (!flag.takesValue && value !== true) throw new Error(`${c.where}: ${name} takes no value`);
    if (flags.has(name)) throw new Error(`${c.where}: ${name} given twice`);
    flags.set(name, value);
  }
  for (const [name, f] of known) if (f.required && !flags.has(name)) throw new Error(`${c.where}: required flag ${name} is missing`);
  return { where: c.where, sub, child, positionals, flags, container: c.container, pod: c.pod, workload: c.workload };
}
function invocationOf(sub: string): Invocation {
  const found = jetrouteContainers()
    .map(invocation)
    .filter((inv) => inv.sub === sub);
  if (found.length !== 1) throw new Error(`expected exactly one container running \`jetroute ${sub}\`, found ${found.length}`);
  return found[0] as Invocation;
}
function intFlag(inv: Invocation, name: string): number {
  const v = inv.flags.get(name);
  if (typeof v !== "string" || !/^-?\d+$/.test(v)) throw new Error(`${inv.where}: ${name} must be given explicitly as an integer, got ${JSON.stringify(v)}`);
  return Number(v);
}
const selects = (selector: unknown, labels: unknown) =>
  isObj(selector) && Object.keys(selector).length > 0 && isObj(labels) && Object.entries(selector).every(([k, v]) => labels[k] === v);

// ---------------------------------------------------------------- the source-of-truth strings
const wire = read("services/extproc/wire.ts");
const headerName = (key: string) => {
  const m = new RegExp(`\\b${key}:\\s*"([^"]+)"`).exec(wire);
  if (!m) throw new Error(`services/extproc/wire.ts: Headers.${key} not found`);
  return m[1] as string;
};
const DESTINATION_HEADER = headerName("destinationEndpoint");
const TARGET_POD_HEADER = headerName("targetPod");

// ============================================================================== tests
describe("deploy/ YAML", () => {
  it("parses without errors or warnings", () => {
    expect(parseErrors).toEqual([]);
    expect(k8s.length).toBeGreaterThanOrEqual(20);
  });

  it("every Kubernetes document has apiVersion, kind and metadata.name, with the apiVersion its kind needs", () => {
    const problems: string[] = [];
    for (const { file, value } of k8s) {
      const id = `${file}: ${String(value.kind)} ${String(at(value, "metadata.name"))}`;
      if (typeof value.apiVersion !== "string" || !value.apiVersion) problems.push(`${id}: no apiVersion`);
      if (typeof value.kind !== "string" || !value.kind) problems.push(`${id}: no kind`);
      if (typeof at(value, "metadata.name") !== "string" || !at(value, "metadata.name")) problems.push(`${id}: no metadata.name`);
      const want = API_VERSIONS[String(value.kind)];
      if (!want) problems.push(`${id}: kind not known to this test; add its apiVersion to API_VERSIONS`);
      else if (value.apiVersion !== want) problems.push(`${id}: apiVersion ${String(value.apiVersion)}, expected ${want}`);
      const hasNs = typeof at(value, "metadata.namespace") === "string";
      if (CLUSTER_SCOPED.has(String(value.kind)) === hasNs) problems.push(`${id}: ${hasNs ? "cluster-scoped kind with a namespace" : "namespaced kind without an explicit metadata.namespace"}`);
    }
    expect(problems).toEqual([]);
  });

  it("no two documents define the same object", () => {
    const seen = new Map<string, string>();
    const dupes: string[] = [];
    for (const { file, value } of k8s) {
      const key = `${String(value.apiVersion)}/${String(value.kind)}/${String(at(value, "metadata.namespace") ?? "")}/${String(at(value, "metadata.name"))}`;
      if (seen.has(key)) dupes.push(`${key} in ${seen.get(key)} and ${file}`);
      seen.set(key, file);
    }
    expect(dupes).toEqual([]);
  });

  it("each kustomization lists every manifest of its directory, and only existing ones", () => {
    const kustomizations = allDocs.filter((d) => isKustomization(d.file));
    expect(kustomizations.map((d) => d.file).sort()).toEqual(["adapters/kustomization.yaml", "autoscaler/kustomization.yaml", "batch/kustomization.yaml", "envoy-gateway/kustomization.yaml", "kubernetes/kustomization.yaml", "monitoring/kustomization.yaml"]);
    for (const { file, value } of kustomizations) {
      const dir = path.dirname(path.join(DEPLOY, file));
      const resources = list(value.resources, `${file} resources`).map((r) => str(r, `${file} resource`));
      for (const r of resources) expect(existsSync(path.join(dir, r)), `${file}: resource ${r} does not exist`).toBe(true);
      const siblings = readdirSync(dir).filter((n) => /\.ya?ml$/.test(n) && n !== "kustomization.yaml");
      expect([...resources].sort(), `${file} must list every manifest next to it`).toEqual(siblings.sort());
      // The image override must name the image the manifests use, or it silently does nothing.
      for (const img of listOrEmpty(value.images)) {
        const name = str(at(img, "name"), `${file} images[].name`);
        const used = resources.some((r) => new RegExp(`image:\\s*${name}(:|@|\\s|$)`, "m").test(readFileSync(path.join(dir, r), "utf8")));
        expect(used, `${file}: images entry ${name} matches no container image`).toBe(true);
      }
    }
  });
});

describe("jetroute command lines", () => {
  it("the CLI parser finds the sub-commands these manifests run", () => {
    for (const sub of ["gateway", "pod-watcher", "metrics-scraper", "kv-bridge", "streams"]) expect(COMMANDS.has(sub), `services/cli-commands.ts lists ${sub}`).toBe(true);
    expect(COMMANDS.get("streams")?.children).toContain("apply");
    expect(COMMANDS.get("gateway")?.flags.get("--port")?.takesValue).toBe(true);
  });

  it("every jetroute container runs an existing sub-command with flags that sub-command defines", () => {
    const containers = jetrouteContainers();
    expect(containers.length).toBeGreaterThanOrEqual(4);
    for (const c of containers) {
      // The image ENTRYPOINT is `node bin/jetroute.js`; overriding `command` would bypass it.
      expect(c.container.command, `${c.where}: must not override the image entrypoint`).toBeUndefined();
      invocation(c); // throws with the reason
    }
    const run = jetrouteContainers().map(invocation).map((inv) => (inv.child ? `${inv.sub} ${inv.child}` : inv.sub));
    expect(run.sort()).toEqual(["adapter-controller", "autoscaler", "batch-api", "batch-worker", "gateway", "kv-bridge", "metrics-scraper", "pod-watcher", "streams apply"]);
  });

  it("every $(VAR) in args is defined for its container (Kubernetes leaves undefined ones verbatim)", () => {
    for (const c of jetrouteContainers()) {
      const defined = new Set<string>(listOrEmpty(c.container.env).map((e) => String(at(e, "name"))));
      for (const src of listOrEmpty(c.container.envFrom)) {
        const cmName = at(src, "configMapRef.name");
        if (typeof cmName !== "string") continue;
        const cm = one("ConfigMap", cmName, nsOf(c.workload));
        for (const k of Object.keys(obj(cm.data, `ConfigMap ${cmName} data`))) defined.add(k);
      }
      for (const arg of listOrEmpty(c.container.args)) {
        for (const [, v] of String(arg).matchAll(/(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) expect(defined.has(v as string), `${c.where}: $(${v}) is not defined`).toBe(true);
      }
    }
  });

  it("the default routing strategy is one the gateway registers", () => {
    const strategy = invocationOf("gateway").flags.get("--strategy");
    expect(typeof strategy).toBe("string");
    const dir = path.join(ROOT, "services/routing/strategies");
    const names = readdirSync(dir)
      .filter((f) => f.endsWith(".ts") && !f.endsWith(".test.ts"))
      .flatMap((f) => [...readFileSync(path.join(dir, f), "utf8").matchAll(/^\s*name:\s*"([^"]+)"/gm)].map((m) => m[1]));
    expect(names).toContain(strategy);
  });

  it("pods run as the image's non-root user", () => {
    const user = /^USER\s+(\d+)(?::(\d+))?\s*$/m.exec(read("deploy/Dockerfile"));
    expect(user, "deploy/Dockerfile needs a numeric USER").not.toBeNull();
    const uid = Number(user?.[1]);
    expect(uid).toBeGreaterThan(0);
    for (const c of jetrouteContainers()) {
      expect(at(c.pod, "securityContext.runAsNonRoot"), c.where).toBe(true);
      expect(at(c.pod, "securityContext.runAsUser"), c.where).toBe(uid);
    }
  });
});

describe("gateway Deployment and Service", () => {
  const gw = () => invocationOf("gateway");
  const gwService = () => {
    const inv = gw();
    const labels = at(inv.workload, "spec.template.metadata.labels");
    const svcs = kinds("Service").filter((s) => nsOf(s) === nsOf(inv.workload) && selects(at(s, "spec.selector"), labels));
    if (svcs.length !== 1) throw new Error(`expected one Service selecting the gateway pods, found ${svcs.length}`);
    return svcs[0] as Obj;
  };
  const grpcPort = (svc: Obj) => obj(listOrEmpty(at(svc, "spec.ports")).find((p) => at(p, "name") === "grpc"), "Service port named grpc");

  it("runs at least two replicas, spread, rolled without losing capacity, with a PodDisruptionBudget", () => {
    const w = gw().workload;
    expect(Number(at(w, "spec.replicas"))).toBeGreaterThanOrEqual(2);
    expect(at(w, "spec.strategy.rollingUpdate.maxUnavailable")).toBe(0);
    expect(at(w, "spec.template.spec.affinity.podAntiAffinity")).toBeDefined();
    const labels = at(w, "spec.template.metadata.labels");
    const pdbs = kinds("PodDisruptionBudget").filter((p) => nsOf(p) === nsOf(w) && selects(at(p, "spec.selector.matchLabels"), labels));
    expect(pdbs.length).toBe(1);
  });

  it("--port, the container port, the Service port and the EnvoyExtensionPolicy backendRef agree", () => {
    const inv = gw();
    const port = intFlag(inv, "--port");
    const cports = listOrEmpty(inv.container.ports);
    expect(at(cports.find((p) => at(p, "name") === "grpc"), "containerPort")).toBe(port);
    expect(at(cports.find((p) => at(p, "name") === "admin"), "containerPort")).toBe(intFlag(inv, "--admin-port"));

    const svc = gwService();
    const sp = grpcPort(svc);
    expect(sp.port).toBe(port);
    expect([port, "grpc"]).toContain(sp.targetPort);
    expect(sp.appProtocol).toBe("kubernetes.io/h2c");

    const eeps = kinds("EnvoyExtensionPolicy");
    expect(eeps.length).toBe(1);
    const eep = eeps[0] as Obj;
    const refs = list(at(eep, "spec.extProc.0.backendRefs"), "extProc[0].backendRefs");
    expect(refs.length).toBe(1);
    const ref = obj(refs[0], "backendRef");
    expect(ref.name).toBe(nameOf(svc));
    expect((ref.namespace as string | undefined) ?? nsOf(eep)).toBe(nsOf(svc));
    expect(ref.port).toBe(port);
  });

  it("probes use Kubernetes gRPC probes on the health service names the gateway registers", () => {
    const source = read("services/gateway/extproc-listener.ts");
    const registered = /new HealthImplementation\(\{([^}]*)\}\)/.exec(source)?.[1] ?? "";
    expect(registered).toMatch(/\bliveness:\s*"SERVING"/);
    expect(registered).toMatch(/\breadiness:\s*"NOT_SERVING"/); // turns SERVING once caught up

    const inv = gw();
    const port = intFlag(inv, "--port");
    expect(at(inv.container, "readinessProbe.grpc")).toEqual({ port, service: "readiness" });
    expect(at(inv.container, "livenessProbe.grpc")).toEqual({ port, service: "liveness" });
    // Envoy's own active health check of the ext_proc cluster asks the same readiness service.
    const hc = at(kinds("EnvoyExtensionPolicy")[0], "spec.extProc.0.backendSettings.healthCheck.active");
    if (hc !== undefined) {
      expect(at(hc, "type")).toBe("GRPC");
      expect(at(hc, "grpc.service")).toBe("readiness");
    }
  });

  it("the admin port listens beyond loopback (Prometheus scrapes it), and only --admin-host opens it", () => {
    const inv = gw();
    // `--admin-host` defaults to 127.0.0.1: the scrape from the Prometheus pod would fail.
    const host = inv.flags.get("--admin-host");
    expect(host, "the gateway needs --admin-host=0.0.0.0 (or the pod IP) for Prometheus").toBeDefined();
    expect(String(host)).not.toMatch(/^(127\.|localhost$|::1$)/);
    // The flag's default is the configuration schema's (services/gateway/config.ts).
    expect(read("services/gateway/command.ts")).toMatch(/\.option\("--admin-host <host>",[^\n]*D\.adminHost\)/);
    expect(read("services/gateway/config.ts")).toMatch(/adminHost: Type\.String\(\{ default: "127\.0\.0\.1" \}\)/);
  });

  it("shutdown grace covers the route timeout, and the pod's grace period covers both", () => {
    const inv = gw();
    const graceS = intFlag(inv, "--shutdown-grace-ms") / 1000;
    const route = one("HTTPRoute", "llm");
    const timeout = seconds(at(route, "spec.rules.0.timeouts.request"));
    expect(graceS, "--shutdown-grace-ms must let the longest request finish").toBeGreaterThanOrEqual(timeout);
    const preStop = list(at(inv.container, "lifecycle.preStop.exec.command"), "preStop command");
    const sleepS = preStop[0] === "sleep" ? Number(preStop[1]) : 0;
    expect(Number(at(inv.pod, "terminationGracePeriodSeconds"))).toBeGreaterThan(sleepS + graceS);
    const idle = at(one("ClientTrafficPolicy"), "spec.timeout.http.streamIdleTimeout");
    expect(seconds(idle), "stream idle timeout must not cut a silent non-streaming completion").toBeGreaterThanOrEqual(timeout);
  });
});

describe("Envoy Gateway wiring", () => {
  const route = () => one("HTTPRoute", "llm");
  const gatewayOfRoute = () => {
    const r = route();
    const parents = list(at(r, "spec.parentRefs"), "HTTPRoute parentRefs");
    expect(parents.length).toBe(1);
    const p = obj(parents[0], "parentRef");
    const gw = one("Gateway", str(p.name, "parentRef name"), (p.namespace as string | undefined) ?? nsOf(r));
    const listeners = list(at(gw, "spec.listeners"), "Gateway listeners");
    const listener = obj(
      listeners.find((l) => at(l, "name") === p.sectionName),
      `listener ${String(p.sectionName)}`,
    );
    return { gw, listener };
  };
  const targets = (policy: Obj) => list(at(policy, "spec.targetRefs"), `${String(policy.kind)} targetRefs`).map((t) => obj(t, "targetRef"));

  it("GatewayClass -> Gateway -> HTTPRoute -> backend Service resolve, cross-namespace refs are granted", () => {
    const { gw, listener } = gatewayOfRoute();
    const gc = one("GatewayClass", str(at(gw, "spec.gatewayClassName"), "gatewayClassName"));
    expect(at(gc, "spec.controllerName")).toBe("gateway.envoyproxy.io/gatewayclass-controller");
    const params = at(gc, "spec.parametersRef");
    if (params !== undefined) one(str(at(params, "kind"), "parametersRef kind"), str(at(params, "name"), "parametersRef name"), str(at(params, "namespace"), "parametersRef namespace"));
    if (at(listener, "allowedRoutes.namespaces.from") === "Same") expect(nsOf(route())).toBe(nsOf(gw));

    const r = route();
    const rules = list(at(r, "spec.rules"), "HTTPRoute rules");
    for (const rule of rules) {
      for (const b of list(at(rule, "backendRefs"), "backendRefs")) {
        const ref = obj(b, "backendRef");
        const ns = (ref.namespace as string | undefined) ?? nsOf(r);
        const svc = one("Service", str(ref.name, "backendRef name"), ns);
        expect(
          listOrEmpty(at(svc, "spec.ports")).some((p) => at(p, "port") === ref.port),
          `Service ${ns}/${nameOf(svc)} has no port ${String(ref.port)}`,
        ).toBe(true);
        if (ns !== nsOf(r)) {
          const granted = kinds("ReferenceGrant").some(
            (g) =>
              nsOf(g) === ns &&
              listOrEmpty(at(g, "spec.from")).some((f) => at(f, "group") === "gateway.networking.k8s.io" && at(f, "kind") === "HTTPRoute" && at(f, "namespace") === nsOf(r)) &&
              listOrEmpty(at(g, "spec.to")).some((t) => at(t, "group") === "" && at(t, "kind") === "Service" && [undefined, nameOf(svc)].includes(at(t, "name") as string | undefined)),
          );
          expect(granted, `no ReferenceGrant in ${ns} lets HTTPRoute ${nsOf(r)}/${nameOf(r)} use Service ${nameOf(svc)}`).toBe(true);
        }
      }
    }
  });

  it("the EnvoyExtensionPolicy and the BackendTrafficPolicy target that HTTPRoute; the ClientTrafficPolicy its Gateway", () => {
    const r = route();
    for (const kind of ["EnvoyExtensionPolicy", "BackendTrafficPolicy"]) {
      const p = one(kind);
      expect(nsOf(p), `${kind} must live in the HTTPRoute's namespace`).toBe(nsOf(r));
      expect(targets(p).map((t) => [t.group, t.kind, t.name])).toEqual([["gateway.networking.k8s.io", "HTTPRoute", nameOf(r)]]);
    }
    const { gw } = gatewayOfRoute();
    const ctp = one("ClientTrafficPolicy");
    expect(nsOf(ctp)).toBe(nsOf(gw));
    expect(targets(ctp).map((t) => [t.group, t.kind, t.name])).toEqual([["gateway.networking.k8s.io", "Gateway", nameOf(gw)]]);
  });

  it("ext_proc: request body Buffered, response body Streamed, generous message timeout, fail closed", () => {
    const ext = obj(at(one("EnvoyExtensionPolicy"), "spec.extProc.0"), "extProc[0]");
    expect(at(ext, "processingMode.request.body")).toBe("Buffered");
    expect(at(ext, "processingMode.response.body")).toBe("Streamed");
    expect(seconds(ext.messageTimeout)).toBeGreaterThanOrEqual(30);
    expect(ext.failOpen).toBe(false);
  });

  it("ext_proc's message timeout outlasts the gateway's P/D prefill budget (the vLLM prefill leg runs inside the request-body phase)", () => {
    const ext = obj(at(one("EnvoyExtensionPolicy"), "spec.extProc.0"), "extProc[0]");
    const gw = invocationOf("gateway");
    // The flag's default when the manifest leaves it out (services/gateway/command.ts).
    const budgetMs = gw.flags.has("--pd-prefill-budget-ms") ? intFlag(gw, "--pd-prefill-budget-ms") : 50_000;
    expect(seconds(ext.messageTimeout) * 1000).toBeGreaterThan(budgetMs);
  });

  it("endpointOverride reads the header the gateway sets", () => {
    const lb = obj(at(one("BackendTrafficPolicy"), "spec.loadBalancer"), "loadBalancer");
    expect(typeof lb.type).toBe("string"); // required by the CRD
    expect(at(lb, "endpointOverride.extractFrom")).toEqual([{ header: DESTINATION_HEADER }]);
    expect(at(one("BackendTrafficPolicy"), "spec.retry"), "a retried completion runs twice").toBeUndefined();
  });

  it("the client buffer limit fits the gateway's body limit, and clients cannot pre-set endpoint headers", () => {
    const ctp = one("ClientTrafficPolicy");
    expect(bytes(at(ctp, "spec.connection.bufferLimit"))).toBeGreaterThanOrEqual(DEFAULT_MAX_BODY_BYTES);
    const removed = list(at(ctp, "spec.headers.earlyRequestHeaders.remove"), "earlyRequestHeaders.remove");
    expect(removed).toEqual(expect.arrayContaining([DESTINATION_HEADER, TARGET_POD_HEADER]));
  });

  it("aibrix-compat: the ORIGINAL_DST patch targets that Gateway, listener and route, on the target-pod header", () => {
    const epp = one("EnvoyPatchPolicy");
    const { gw, listener } = gatewayOfRoute();
    const r = route();
    expect(nsOf(epp)).toBe(nsOf(gw));
    expect([at(epp, "spec.targetRef.group"), at(epp, "spec.targetRef.kind"), at(epp, "spec.targetRef.name")]).toEqual(["gateway.networking.k8s.io", "Gateway", nameOf(gw)]);
    const patches = list(at(epp, "spec.jsonPatches"), "jsonPatches").map((p) => obj(p, "jsonPatch"));
    const cluster = obj(
      patches.find((p) => p.type === "type.googleapis.com/envoy.config.cluster.v3.Cluster"),
      "Cluster patch",
    );
    const value = obj(at(cluster, "operation.value"), "cluster value");
    expect(value.name).toBe(cluster.name);
    expect(value.type).toBe("ORIGINAL_DST");
    expect(value.lb_policy).toBe("CLUSTER_PROVIDED");
    expect(at(value, "original_dst_lb_config")).toEqual({ use_http_header: true, http_header_name: TARGET_POD_HEADER });

    const routeCfg = obj(
      patches.find((p) => p.type === "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"),
      "RouteConfiguration patch",
    );
    // Envoy Gateway 1.5 default xDS names: <gateway namespace>/<gateway name>/<listener name>.
    expect(routeCfg.name).toBe(`${nsOf(gw)}/${nameOf(gw)}/${String(listener.name)}`);
    expect(at(routeCfg, "operation.value")).toBe(cluster.name);
    // The generated route is found by its cluster name: only valid while rule 0 has one backend.
    expect(String(at(routeCfg, "operation.jsonPath"))).toContain(`'httproute/${nsOf(r)}/${nameOf(r)}/rule/0'`);
    expect(list(at(r, "spec.rules.0.backendRefs"), "rule 0 backendRefs").length).toBe(1);
  });
});

describe("pod-watcher, metrics-scraper, streams, NATS", () => {
  it("the pod-watcher runs in Kubernetes mode as an HA pair: 2 replicas, leader election, distinct identities, API token mounted", () => {
    const inv = invocationOf("pod-watcher");
    expect(inv.flags.get("--kubernetes")).toBe(true);
    expect(inv.flags.has("--static")).toBe(false);
    expect(inv.flags.get("--leader-election")).toBe(true);
    expect(Number(at(inv.workload, "spec.replicas"))).toBe(2);
    expect(at(inv.pod, "automountServiceAccountToken")).not.toBe(false);
    // The watcher id and lease namespace come from the downward API: the pod's own name and namespace.
    const env = listOrEmpty(inv.container.env);
    const fieldOf = (name: string) => at(env.find((e) => at(e, "name") === name), "valueFrom.fieldRef.fieldPath");
    expect(inv.flags.get("--watcher-id")).toBe("$(POD_NAME)");
    expect(fieldOf("POD_NAME")).toBe("metadata.name");
    expect(inv.flags.get("--lease-namespace")).toBe("$(POD_NAMESPACE)");
    expect(fieldOf("POD_NAMESPACE")).toBe("metadata.namespace");
    expect(String(inv.flags.get("--source"))).toMatch(/^[A-Za-z0-9][-A-Za-z0-9_.]*$/);
  });

  it("a leader takeover (lease + two renewals + a heartbeat + slack) fits inside the gateways' pod source timeout; a cut-off leader steps down within a third of it", () => {
    const pw = invocationOf("pod-watcher");
    const gw = invocationOf("gateway");
    const lease = intFlag(pw, "--lease-ms");
    const heartbeat = intFlag(pw, "--heartbeat-ms");
    const timeout = intFlag(gw, "--pod-source-timeout-ms");
    // The standby sees the last renewal up to one renewal interval late (its rounds are a third of
    // the lease apart) and acts at its next round: lease + 2 renewals, then its first heartbeat.
    const renewal = Math.floor(lease / 3);
    const slack = 2_000;
    expect(lease + 2 * renewal + heartbeat + slack).toBeLessThanOrEqual(timeout);
    expect(heartbeat * 3).toBeLessThanOrEqual(timeout);
    expect(intFlag(pw, "--step-down-after-ms")).toBeLessThanOrEqual(timeout / 3);
    // PODS keeps messages 30 days (streams/definitions.ts): re-assertion must come well before.
    expect(intFlag(pw, "--reassert-ms")).toBeLessThan(24 * 3600_000);
  });

  const rulesOf = (sa: string, saNamespace: string, namespace: string | undefined) => {
    const bindings = [...kinds("RoleBinding").filter((b) => namespace === undefined || nsOf(b) === namespace), ...kinds("ClusterRoleBinding")].filter((b) =>
      listOrEmpty(at(b, "subjects")).some((s) => at(s, "kind") === "ServiceAccount" && at(s, "name") === sa && at(s, "namespace") === saNamespace),
    );
    return bindings.flatMap((b) => {
      const role = one(str(at(b, "roleRef.kind"), "roleRef kind"), str(at(b, "roleRef.name"), "roleRef name"), at(b, "roleRef.kind") === "Role" ? nsOf(b) : undefined);
      return listOrEmpty(role.rules);
    });
  };
  const verbsFor = (rules: unknown[], group: string, resource: string) =>
    rules.filter((r) => listOrEmpty(at(r, "apiGroups")).includes(group) && listOrEmpty(at(r, "resources")).includes(resource)).flatMap((r) => listOrEmpty(at(r, "verbs")));

  it("RBAC: pods get/list/watch in every namespace the pod-watcher watches; leases get/create/update where its Lease lives", () => {
    const inv = invocationOf("pod-watcher");
    const sa = str(at(inv.pod, "serviceAccountName"), "pod-watcher serviceAccountName");
    one("ServiceAccount", sa, nsOf(inv.workload));
    const namespaces = String(inv.flags.get("--namespaces") ?? "").split(",").filter(Boolean);
    expect(namespaces.length, "--namespaces (all namespaces would need a ClusterRoleBinding)").toBeGreaterThan(0);
    for (const ns of namespaces) expect(verbsFor(rulesOf(sa, nsOf(inv.workload), ns), "", "pods"), `pods in ${ns}`).toEqual(expect.arrayContaining(["get", "list", "watch"]));
    // --lease-namespace is the pod's own namespace (downward API, checked above).
    expect(verbsFor(rulesOf(sa, nsOf(inv.workload), nsOf(inv.workload)), "coordination.k8s.io", "leases")).toEqual(expect.arrayContaining(["get", "create", "update"]));
    // Least privilege: nothing that writes pods.
    const all = rulesOf(sa, nsOf(inv.workload), undefined);
    expect(verbsFor(all, "", "pods").filter((v) => !["get", "list", "watch"].includes(String(v)))).toEqual([]);
  });

  it("autoscaler: an HA pair applying through the drain handshake; RBAC covers the scale subresources and pod annotations --apply uses, in the model namespace", () => {
    const inv = invocationOf("autoscaler");
    expect(Number(at(inv.workload, "spec.replicas"))).toBe(2);
    expect(inv.flags.has("--leader-election")).toBe(true);
    expect(inv.flags.has("--apply")).toBe(true);
    expect(inv.flags.has("--no-drain"), "the manifest keeps the drain handshake").toBe(false);
    const sa = str(at(inv.pod, "serviceAccountName"), "autoscaler serviceAccountName");
    one("ServiceAccount", sa, nsOf(inv.workload));
    // The model namespace is the pod-watcher's: the autoscaler scales the workloads whose pods it watches.
    const namespaces = String(invocationOf("pod-watcher").flags.get("--namespaces") ?? "").split(",").filter(Boolean);
    for (const ns of namespaces) {
      const rules = rulesOf(sa, nsOf(inv.workload), ns);
      for (const res of ["deployments/scale", "statefulsets/scale"]) expect(verbsFor(rules, "apps", res), `${res} in ${ns}`).toEqual(expect.arrayContaining(["get", "update"]));
      expect(verbsFor(rules, "", "pods"), `pods in ${ns}`).toEqual(expect.arrayContaining(["get", "list", "patch"]));
    }
    // The annotations --apply writes are the ones the pod-watcher reads.
    expect(read("services/pod-watcher/k8s-pods.ts")).toContain('ANNOTATION_DRAIN_DEADLINE = "jetroute.io/drain-deadline"');
    expect(read("services/autoscaler/apply-plan.ts")).toContain('DRAIN_DEADLINE_ANNOTATION = "jetroute.io/drain-deadline"');
  });

  it("the default label selector of the manifest is the discovery label the code maps", () => {
    const inv = invocationOf("pod-watcher");
    const mapping = read("services/pod-watcher/k8s-pods.ts");
    expect(mapping).toContain(`LABEL_MODEL = "${String(inv.flags.get("--label-selector"))}"`);
  });

  it("metrics-scraper runs as a single replica", () => {
    const inv = invocationOf("metrics-scraper");
    expect(Number(at(inv.workload, "spec.replicas"))).toBe(1);
    expect(intFlag(inv, "--interval-ms")).toBeGreaterThan(0);
  });

  it("NATS: 3-node JetStream cluster on file storage, and streams replicated within it", () => {
    const values = obj(allDocs.find((d) => d.file === "nats/values.yaml")?.value, "deploy/nats/values.yaml");
    expect(at(values, "config.cluster.enabled")).toBe(true);
    const servers = Number(at(values, "config.cluster.replicas"));
    expect(servers).toBeGreaterThanOrEqual(3);
    expect(at(values, "config.jetstream.enabled")).toBe(true);
    expect(at(values, "config.jetstream.fileStore.enabled")).toBe(true);
    expect(at(values, "config.jetstream.memoryStore.enabled")).toBe(false);
    expect(bytes(at(values, "config.jetstream.fileStore.maxSize"))).toBeLessThan(bytes(at(values, "config.jetstream.fileStore.pvc.size")));

    const apply = invocationOf("streams");
    expect(apply.child).toBe("apply");
    const replicas = intFlag(apply, "--replicas");
    expect(replicas).toBe(3);
    expect(replicas).toBeLessThanOrEqual(servers);
    expect(String(at(apply.workload, "kind"))).toBe("Job");

    // Every process talks to the Helm release `nats` in the control-plane namespace.
    const cm = one("ConfigMap", "jetroute-config");
    const url = new URL(str(at(cm, "data.NATS_URL"), "NATS_URL").split(",")[0] as string);
    expect(url.protocol).toBe("nats:");
    expect(url.hostname.startsWith(`nats.${nsOf(cm)}.svc`)).toBe(true);
    expect(url.port).toBe("4222");
  });
});

// ---------------------------------------------------------------- Prometheus scraping
/** The flag that sets the port serving /metrics, per sub-command, and the source line that serves it. */
const METRICS_FLAG: Record<string, { flag: string; serves: () => boolean }> = {
  gateway: {
    flag: "--admin-port",
    serves: () =>
      /req\.url === "\/metrics"/.test(read("services/gateway/admin-server.ts")) &&
      /startAdminServer\(\{\s*port: config\.adminPort/.test(read("services/gateway/gateway.ts")) &&
      /adminPort:\s*o\.adminPort/.test(read("services/gateway/command.ts")),
  },
  ...Object.fromEntries(
    ["pod-watcher", "metrics-scraper", "kv-bridge", "autoscaler"].map((sub) => [
      sub,
      {
        flag: "--metrics-port",
        serves: () => /startMetricsServer\(\s*o\.metricsPort\b/.test(read(COMMANDS.get(sub)?.file ?? "")) && /req\.url !== "\/metrics"/.test(read("services/shared/metrics-server.ts")),
      },
    ]),
  ),
};

/** The Services a ServiceMonitor selects (matchLabels and matchExpressions `In`: anything else fails the test). */
function servicesSelectedBy(sm: Obj, objects: Obj[] = k8s.map((d) => d.value)): Obj[] {
  const where = `ServiceMonitor ${nsOf(sm)}/${nameOf(sm)}`;
  const sel = obj(at(sm, "spec.selector"), `${where} spec.selector`);
  for (const k of Object.keys(sel)) expect(["matchLabels", "matchExpressions"], `${where}: this test understands matchLabels and matchExpressions only`).toContain(k);
  const expressions = listOrEmpty(sel.matchExpressions).map((e) => obj(e, `${where} matchExpression`));
  for (const e of expressions) expect(e.operator, `${where}: this test understands the In operator only`).toBe("In");
  const nsSel = at(sm, "spec.namespaceSelector");
  expect(at(nsSel, "any"), `${where}: namespaceSelector.any would scrape every namespace`).not.toBe(true);
  const namespaces = listOrEmpty(at(nsSel, "matchNames")).map((n) => String(n));
  const allowed = namespaces.length > 0 ? namespaces : [nsOf(sm)];
  return objects.filter((svc) => {
    if (svc.kind !== "Service" || !allowed.includes(nsOf(svc))) return false;
    const labels = (at(svc, "metadata.labels") as Obj | undefined) ?? {};
    return selects(sel.matchLabels, labels) && expressions.every((e) => listOrEmpty(e.values).includes(labels[String(e.key)]));
  });
}

/** The jetroute containers behind a Service (pod templates its selector matches, same namespace). */
function containersBehind(svc: Obj, objects: Obj[] = k8s.map((d) => d.value)): Array<{ inv: Invocation; port: Obj }> {
  const out: Array<{ inv: Invocation; port: Obj }> = [];
  for (const c of jetrouteContainers(objects)) {
    if (nsOf(c.workload) !== nsOf(svc) || !selects(at(svc, "spec.selector"), at(c.workload, "spec.template.metadata.labels"))) continue;
    for (const p of listOrEmpty(c.container.ports)) out.push({ inv: invocation(c), port: obj(p, "container port") });
  }
  return out;
}

describe("Prometheus ServiceMonitors", () => {
  const monitors = () => kinds("ServiceMonitor");

  it("every ServiceMonitor selects an existing Service, by a port name that Service has, leading to a container port", () => {
    expect(monitors().length).toBeGreaterThan(0);
    for (const sm of monitors()) {
      const where = `ServiceMonitor ${nsOf(sm)}/${nameOf(sm)}`;
      const services = servicesSelectedBy(sm);
      expect(services.length, `${where} selects no Service`).toBeGreaterThan(0);
      const endpoints = list(at(sm, "spec.endpoints"), `${where} endpoints`).map((e) => obj(e, `${where} endpoint`));
      expect(endpoints.length).toBeGreaterThan(0);
      for (const ep of endpoints) {
        const portName = str(ep.port, `${where} endpoint port (a Service port name)`);
        expect(ep.path ?? "/metrics", `${where}: jetroute serves /metrics only`).toBe("/metrics");
        if (ep.interval !== undefined && ep.scrapeTimeout !== undefined) expect(seconds(ep.scrapeTimeout), `${where}: scrapeTimeout must not exceed interval`).toBeLessThanOrEqual(seconds(ep.interval));
        for (const svc of services) {
          const sp = listOrEmpty(at(svc, "spec.ports")).find((p) => at(p, "name") === portName);
          expect(sp, `${where}: Service ${nameOf(svc)} has no port named ${portName}`).toBeDefined();
          const target = at(sp, "targetPort") ?? at(sp, "port");
          const behind = containersBehind(svc).filter(({ port }) => port.name === target || port.containerPort === target);
          expect(behind.length, `${where}: Service ${nameOf(svc)} port ${portName} (targetPort ${String(target)}) reaches no jetroute container port`).toBeGreaterThan(0);
        }
      }
    }
  });

  it("gateway, pod-watcher, metrics-scraper, kv-bridge and autoscaler are each scraped once, on the port their metrics flag opens", () => {
    const scraped = new Map<string, number>();
    for (const sm of monitors()) {
      for (const ep of listOrEmpty(at(sm, "spec.endpoints"))) {
        for (const svc of servicesSelectedBy(sm)) {
          const sp = listOrEmpty(at(svc, "spec.ports")).find((p) => at(p, "name") === at(ep, "port"));
          const target = at(sp, "targetPort") ?? at(sp, "port");
          for (const { inv, port } of containersBehind(svc)) {
            if (port.name !== target && port.containerPort !== target) continue;
            const m = METRICS_FLAG[inv.sub];
            expect(m, `${inv.where}: scraped, but \`jetroute ${inv.sub}\` serves no /metrics`).toBeDefined();
            const flagPort = intFlag(inv, m?.flag ?? "");
            expect(port.containerPort, `${inv.where}: the scraped container port must be ${m?.flag}`).toBe(flagPort);
            scraped.set(inv.sub, (scraped.get(inv.sub) ?? 0) + 1);
          }
        }
      }
    }
    for (const sub of Object.keys(METRICS_FLAG)) {
      expect(scraped.get(sub), `\`jetroute ${sub}\` must be scraped by exactly one ServiceMonitor endpoint`).toBe(1);
      expect(METRICS_FLAG[sub]?.serves(), `${sub}: the source no longer serves /metrics on ${METRICS_FLAG[sub]?.flag}`).toBe(true);
      const inv = invocationOf(sub);
      expect(intFlag(inv, METRICS_FLAG[sub]?.flag ?? "")).toBeGreaterThan(0); // -1 turns the endpoint off
    }
  });
});

// ---------------------------------------------------------------- NATS credentials and TLS
describe("NATS authentication and TLS wiring", () => {
  const natsSource = read("services/shared/nats.ts");
  const block = /export const NATS_ENV = \{([^}]*)\}/.exec(natsSource)?.[1] ?? "";
  const NATS_VARS = [...block.matchAll(/"(NATS_[A-Z_]+)"/g)].map((m) => m[1] as string);
  const fileOf = (workload: Obj) => allDocs.find((d) => d.value === workload)?.file ?? "?";

  it("the variables are the ones services/shared/nats.ts reads", () => {
    expect(NATS_VARS.sort()).toEqual(["NATS_CA", "NATS_CERT", "NATS_CREDS", "NATS_KEY", "NATS_NKEY", "NATS_PASSWORD", "NATS_TOKEN", "NATS_USER"]);
  });

  it("every jetroute container takes the same optional Secret references, and shows the file-based ones", () => {
    const shapes = new Set<string>();
    for (const c of jetrouteContainers()) {
      const entries = listOrEmpty(c.container.env)
        .map((e) => obj(e, `${c.where} env`))
        .filter((e) => String(e.name).startsWith("NATS_"));
      for (const e of entries) {
        const name = String(e.name);
        expect(NATS_VARS, `${c.where}: ${name} is not read by services/shared/nats.ts`).toContain(name);
        const ref = at(e, "valueFrom.secretKeyRef");
        if (ref !== undefined) {
          expect(at(ref, "optional"), `${c.where}: ${name} must be optional (no Secret = no NATS auth)`).toBe(true);
          continue;
        }
        // A file variable switched on: its path must lie in a mounted Secret volume.
        const file = str(e.value, `${c.where} ${name} value`);
        const mount = listOrEmpty(c.container.volumeMounts).find((m) => file.startsWith(`${String(at(m, "mountPath")).replace(/\/$/, "")}/`));
        const volume = listOrEmpty(c.pod.volumes).find((v) => at(v, "name") === at(mount, "name"));
        expect(at(volume, "secret.secretName"), `${c.where}: ${name}=${file} is not in a mounted Secret`).toBeDefined();
      }
      const byRef = entries.filter((e) => at(e, "valueFrom.secretKeyRef") !== undefined);
      expect(byRef.map((e) => e.name).sort(), `${c.where}`).toEqual(["NATS_PASSWORD", "NATS_TOKEN", "NATS_USER"]);
      // One Secret per process (each has its own NATS user, deploy/nats/values.yaml), the same
      // keys in each: jetroute-nats-<component>, the Job that applies streams as the admin.
      const component = String((at(c.workload, "spec.template.metadata.labels") as Obj | undefined)?.["app.kubernetes.io/component"] ?? "");
      const secret = `jetroute-nats-${component === "streams-apply" ? "admin" : component}`;
      for (const e of byRef) expect(at(e, "valueFrom.secretKeyRef.name"), `${c.where}: ${String(e.name)}`).toBe(secret);
      shapes.add(JSON.stringify(byRef.map((e) => [e.name, at(e, "valueFrom.secretKeyRef.key")])));
      // The file-based variables are there for the operator to switch on (commented out or set).
      const text = read(`deploy/${fileOf(c.workload)}`);
      for (const v of ["NATS_CREDS", "NATS_NKEY", "NATS_CA", "NATS_CERT", "NATS_KEY"]) expect(text, `${fileOf(c.workload)} should show ${v}`).toMatch(new RegExp(`name: ${v}\\b`));
    }
    expect(shapes.size, "every process's Secret must have the same keys").toBe(1);
  });

  it("no NATS secret sits in the shared ConfigMap", () => {
    const cm = one("ConfigMap", "jetroute-config");
    const keys = Object.keys(obj(cm.data, "jetroute-config data"));
    expect(keys.filter((k) => NATS_VARS.includes(k))).toEqual([]);
    expect(String(at(cm, "data.NATS_URL")), "credentials in NATS_URL would sit in a ConfigMap").not.toMatch(/@/);
  });
});

describe("container image", () => {
  const dockerfile = read("deploy/Dockerfile");

  it("ENTRYPOINT runs bin/jetroute.js, which exists and is the package's bin", () => {
    const m = /^ENTRYPOINT\s+(\[.*\])\s*$/m.exec(dockerfile);
    expect(m, "exec-form ENTRYPOINT").not.toBeNull();
    const entry = JSON.parse(m?.[1] ?? "[]") as string[];
    expect(entry[0]).toBe("node");
    const script = entry[1] ?? "";
    expect(existsSync(path.join(ROOT, script)), `${script} must exist in the repository`).toBe(true);
    const pkg = JSON.parse(read("package.json")) as { bin?: Record<string, string> };
    expect(pkg.bin?.jetroute).toBe(script);
  });

  it("is a multi-stage node:20-slim build: npm ci, npm run build, npm prune --omit=dev; the runtime stage gets bin, dist, node_modules", () => {
    const stages = dockerfile.split(/^FROM\s+/m).slice(1);
    expect(stages.length).toBeGreaterThanOrEqual(2);
    for (const s of stages) expect(s.startsWith("node:20-slim")).toBe(true);
    expect(dockerfile).toMatch(/^RUN npm ci\b/m);
    expect(dockerfile).toMatch(/npm run build\b/);
    expect(dockerfile).toMatch(/npm prune --omit=dev\b/);
    const runtime = stages[stages.length - 1] ?? "";
    for (const dir of ["bin", "dist", "node_modules"]) expect(runtime).toMatch(new RegExp(`^COPY --from=\\w+ /app/${dir} \\./${dir}$`, "m"));
    expect(runtime).toMatch(/^USER\s+\d+/m);
    // The compiled CLI bin/jetroute.js loads.
    expect(read("bin/jetroute.js")).toContain("../dist/services/cli.js");
  });
});

// ---------------------------------------------------------------- NetworkPolicies
describe("NetworkPolicies", () => {
  const policies = () => kinds("NetworkPolicy");
  const policy = (name: string) => one("NetworkPolicy", name, "jetroute");
  /** The pod templates of jetroute workloads a policy's podSelector picks (matchLabels and matchExpressions In). */
  const selected = (np: Obj) => {
    const sel = obj(at(np, "spec.podSelector"), `NetworkPolicy ${nameOf(np)} podSelector`);
    return jetrouteContainers().filter(({ workload }) => {
      if (nsOf(workload) !== nsOf(np)) return false;
      const labels = obj(at(workload, "spec.template.metadata.labels"), "pod labels");
      const ml = isObj(sel.matchLabels) ? sel.matchLabels : {};
      const okLabels = Object.entries(ml).every(([k, v]) => labels[k] === v);
      const okExpr = listOrEmpty(sel.matchExpressions).every((e) => at(e, "operator") === "In" && listOrEmpty(at(e, "values")).includes(labels[String(at(e, "key"))]));
      return okLabels && okExpr && (Object.keys(ml).length > 0 || listOrEmpty(sel.matchExpressions).length > 0);
    });
  };
  const ingressPorts = (np: Obj) => listOrEmpty(at(np, "spec.ingress")).flatMap((r) => listOrEmpty(at(r, "ports")).map((p) => at(p, "port")));

  it("every long-running jetroute process and the Job sit behind a policy that names only ports their containers open", () => {
    const covered = new Set<string>();
    for (const np of policies().filter((p) => nameOf(p) !== "nats")) {
      expect(at(np, "spec.policyTypes"), nameOf(np)).toEqual(["Ingress"]);
      const pods = selected(np);
      expect(pods.length, `NetworkPolicy ${nameOf(np)} selects no jetroute pod`).toBeGreaterThan(0);
      for (const c of pods) {
        covered.add(invocation(c).sub);
        const open = listOrEmpty(c.container.ports).flatMap((p) => [at(p, "name"), at(p, "containerPort")]);
        for (const port of ingressPorts(np)) expect(open, `${nameOf(np)}: ${c.where} has no port ${String(port)}`).toContain(port);
      }
    }
    expect([...covered].sort()).toEqual(["adapter-controller", "autoscaler", "batch-api", "batch-worker", "gateway", "kv-bridge", "metrics-scraper", "pod-watcher", "streams"]);
  });

  it("gateway: ext_proc from the Envoy proxies of the route's Gateway only, admin from Prometheus only", () => {
    const np = policy("jetroute-gateway");
    const rules = listOrEmpty(at(np, "spec.ingress"));
    const byPort = (port: string) => rules.filter((r) => listOrEmpty(at(r, "ports")).some((p) => at(p, "port") === port));
    const grpc = byPort("grpc");
    expect(grpc.length).toBe(1);
    const envoy = listOrEmpty(at(grpc[0], "from"));
    expect(envoy.length).toBe(1);
    const route = one("HTTPRoute", "llm");
    const parent = obj(list(at(route, "spec.parentRefs"), "parentRefs")[0], "parentRef");
    expect(at(envoy[0], "podSelector.matchLabels")).toEqual({
      "gateway.envoyproxy.io/owning-gateway-name": parent.name,
      "gateway.envoyproxy.io/owning-gateway-namespace": (parent.namespace as string | undefined) ?? nsOf(route),
    });
    const admin = byPort("admin");
    expect(admin.length).toBe(1);
    expect(at(listOrEmpty(at(admin[0], "from"))[0], "podSelector.matchLabels")).toEqual({ "app.kubernetes.io/name": "prometheus" });
    expect(rules.length, "no other ingress").toBe(2);
  });

  it("NATS: clients (4222) only from pods labelled part-of jetroute, which every jetroute pod template is", () => {
    const np = policy("nats");
    const client = listOrEmpty(at(np, "spec.ingress")).filter((r) => listOrEmpty(at(r, "ports")).some((p) => at(p, "port") === 4222));
    expect(client.length).toBe(1);
    expect(listOrEmpty(at(client[0], "from"))).toEqual([{ podSelector: { matchLabels: { "app.kubernetes.io/part-of": "jetroute" } } }]);
    for (const c of jetrouteContainers()) expect((at(c.workload, "spec.template.metadata.labels") as Obj | undefined)?.["app.kubernetes.io/part-of"], `${c.where}: NATS would refuse it`).toBe("jetroute");
    const url = new URL(str(at(one("ConfigMap", "jetroute-config"), "data.NATS_URL"), "NATS_URL").split(",")[0] as string);
    expect(url.port).toBe("4222");
  });

  it("NATS: the values define one user per process, and the Helm env supplies each password variable", () => {
    const values = obj(allDocs.find((d) => d.file === "nats/values.yaml")?.value, "deploy/nats/values.yaml");
    const users = list(at(values, "config.merge.accounts.JETROUTE.users"), "accounts.JETROUTE.users").map((u) => obj(u, "user"));
    expect(at(values, "config.merge.accounts.JETROUTE.jetstream")).toBe("enabled");
    const env = obj(at(values, "container.env"), "container.env");
    for (const u of users) {
      const v = /^<< \$([A-Z0-9_]+) >>$/.exec(String(u.password))?.[1];
      expect(v, `user ${String(u.user)}: password must be a << $VAR >> reference`).toBeDefined();
      expect(at(env[v ?? ""], "valueFrom.secretKeyRef.name"), `${v} must come from a Secret`).toBe("jetroute-nats-users");
    }
    expect(users.map((u) => u.user).sort()).toEqual(["jr-admin", "jr-analyst", "jr-autoscaler", "jr-batch-api", "jr-batch-worker", "jr-gateway", "jr-kv-bridge", "jr-metrics-scraper", "jr-pod-watcher"]);
  });
});

// ---------------------------------------------------------------- gateway pools (deploy/pools)
/** `kubectl kustomize <dir>`: the objects `kubectl apply -k <dir>` would send. */
function kustomize(dir: string): Obj[] {
  const out = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8", timeout: 60_000, stdio: ["ignore", "pipe", "pipe"] });
  return parseAllDocuments(out)
    .map((d) => d.toJS() as unknown)
    .filter(isObj);
}
const POOL_LABEL = "jetroute.io/gateway-pool";
const poolOf = (o: Obj) => (at(o, "metadata.labels") as Obj | undefined)?.[POOL_LABEL] as string | undefined;
const templatePoolOf = (w: Obj) => (at(w, "spec.template.metadata.labels") as Obj | undefined)?.[POOL_LABEL] as string | undefined;
/** The processes that take --pool and must all name their pool's. */
const POOLED = ["gateway", "pod-watcher", "metrics-scraper", "kv-bridge"];

describe("gateway pools (deploy/pools, as `kubectl kustomize` renders it)", () => {
  let cache: Obj[] | undefined;
  const rendered = () => {
    cache ??= kustomize(POOLS_DIR);
    return cache;
  };
  /** The whole installation: the base manifests plus the pools. */
  const installed = () => [...k8s.map((d) => d.value), ...rendered()];
  const kindIn = (objects: Obj[], kind: string) => objects.filter((o) => o.kind === kind);
  const oneIn = (objects: Obj[], kind: string, name: string, ns?: string) => {
    const found = objects.filter((o) => o.kind === kind && nameOf(o) === name && (ns === undefined || nsOf(o) === ns));
    if (found.length !== 1) throw new Error(`expected exactly one ${kind} ${ns ?? "*"}/${name}, found ${found.length}`);
    return found[0] as Obj;
  };
  const pools = () => [...new Set(rendered().map(poolOf).filter((p): p is string => p !== undefined))].sort();
  const ofPool = (pool: string) => rendered().filter((o) => poolOf(o) === pool);
  const invocationsOf = (pool: string) => jetrouteContainers(ofPool(pool)).map(invocation);
  const processOf = (pool: string, sub: string, child?: string) => {
    const found = invocationsOf(pool).filter((inv) => inv.sub === sub && inv.child === child);
    if (found.length !== 1) throw new Error(`pool ${pool}: expected one container running \`jetroute ${sub}${child ? ` ${child}` : ""}\`, found ${found.length}`);
    return found[0] as Invocation;
  };
  const modelsOf = (pool: string) => String(processOf(pool, "config", "set-pool").flags.get("--models")).split(",");
  const targetsOf = (policy: Obj) => list(at(policy, "spec.targetRefs"), `${String(policy.kind)} ${nameOf(policy)} targetRefs`).map((t) => obj(t, "targetRef"));
  /** Deployment and Job pod templates in `ns` whose labels `selector` matches. */
  const workloadsSelectedBy = (selector: unknown, ns: string) =>
    installed().filter((w) => (w.kind === "Deployment" || w.kind === "Job") && nsOf(w) === ns && selects(selector, at(w, "spec.template.metadata.labels")));
  const gatewayOf = (pool: string | undefined) => {
    const found = jetrouteContainers(installed())
      .map(invocation)
      .filter((inv) => inv.sub === "gateway" && templatePoolOf(inv.workload) === pool);
    if (found.length !== 1) throw new Error(`expected one gateway Deployment for ${pool ?? "the base"}, found ${found.length}`);
    return found[0] as Invocation;
  };

  it("renders with kubectl kustomize into the example pools chat and code, one directory each, every object valid and labelled with its pool", () => {
    expect(pools()).toEqual(["chat", "code"]);
    const dirs = readdirSync(POOLS_DIR).filter((n) => statSync(path.join(POOLS_DIR, n)).isDirectory() && n !== "pool");
    expect(dirs.sort(), "one directory per pool, named after it").toEqual(pools());
    const problems: string[] = [];
    for (const o of rendered()) {
      const id = `${String(o.kind)} ${nsOf(o)}/${nameOf(o)}`;
      const want = API_VERSIONS[String(o.kind)];
      if (o.apiVersion !== want) problems.push(`${id}: apiVersion ${String(o.apiVersion)}, expected ${want}`);
      if (CLUSTER_SCOPED.has(String(o.kind))) problems.push(`${id}: a pool adds no cluster-scoped object`);
      else if (typeof at(o, "metadata.namespace") !== "string") problems.push(`${id}: no namespace`);
      const pool = poolOf(o);
      // Only the NetworkPolicies, shared by every pool, carry no pool label.
      if (pool === undefined) {
        if (o.kind !== "NetworkPolicy") problems.push(`${id}: no ${POOL_LABEL} label`);
      } else if (!nameOf(o).endsWith(`-${pool}`)) problems.push(`${id}: the name of an object of pool ${pool} must end in -${pool}`);
    }
    expect(problems).toEqual([]);
  });

  it("per-pool names collide neither with each other nor with the base installation", () => {
    const seen = new Map<string, string>();
    const dupes: string[] = [];
    for (const o of installed()) {
      const key = `${String(o.kind)} ${String(at(o, "metadata.namespace") ?? "")}/${nameOf(o)}`;
      const owner = poolOf(o) ?? "base";
      if (seen.has(key)) dupes.push(`${key}: ${seen.get(key)} and ${owner}`);
      seen.set(key, owner);
    }
    expect(dupes).toEqual([]);
  });

  it("every pooled process of a pool runs with that pool's --pool, the set-pool Job names the same pool; the base processes run unpooled", () => {
    for (const pool of pools()) {
      const invs = invocationsOf(pool);
      expect(invs.map((i) => (i.child ? `${i.sub} ${i.child}` : i.sub)).sort(), `pool ${pool}'s processes`).toEqual(["config set-pool", "gateway", "kv-bridge", "metrics-scraper", "pod-watcher"]);
      for (const inv of invs) {
        expect(templatePoolOf(inv.workload), `${inv.where}: pod template label`).toBe(pool);
        if (inv.sub === "config") {
          expect(inv.positionals, `${inv.where}: set-pool's pool`).toEqual([pool]);
          expect(inv.flags.has("--pool"), `${inv.where}: set-pool names the pool as its argument`).toBe(false);
          continue;
        }
        expect(POOLED).toContain(inv.sub);
        expect(inv.flags.get("--pool"), `${inv.where}: --pool`).toBe(pool);
        // --models, where given instead of the config entry, must be the Job's list.
        const models = inv.flags.get("--models");
        if (models !== undefined) expect(String(models).split(",").sort(), `${inv.where}: --models`).toEqual(modelsOf(pool).sort());
      }
      expect(Number(at(processOf(pool, "config", "set-pool").workload, "spec.backoffLimit"))).toBeGreaterThan(0);
      expect(intFlag(processOf(pool, "config", "set-pool"), "--replicas"), "the pool's streams have as many replicas as the base ones").toBe(intFlag(invocationOf("streams"), "--replicas"));
    }
    for (const inv of jetrouteContainers().map(invocation)) expect(inv.flags.has("--pool"), `${inv.where}: the base installation is unpooled`).toBe(false);
  });

  it("each pool's EnvoyExtensionPolicy (one per pool) targets only that pool's HTTPRoutes and points at that pool's own gateway Service", () => {
    const all = kindIn(installed(), "EnvoyExtensionPolicy");
    for (const pool of pools()) {
      const eeps = kindIn(ofPool(pool), "EnvoyExtensionPolicy");
      expect(eeps.length, `pool ${pool}: one EnvoyExtensionPolicy`).toBe(1);
      const eep = eeps[0] as Obj;
      const routes = kindIn(ofPool(pool), "HTTPRoute");
      expect(routes.length).toBeGreaterThan(0);
      expect(targetsOf(eep).map((t) => [t.group, t.kind, t.name]).sort(), `${nameOf(eep)} targets exactly pool ${pool}'s routes`).toEqual(
        routes.map((r) => ["gateway.networking.k8s.io", "HTTPRoute", nameOf(r)]).sort(),
      );
      for (const r of routes) {
        expect(nsOf(r)).toBe(nsOf(eep));
        // No other policy attaches an ext_proc to this pool's routes.
        const attached = all.filter((p) => targetsOf(p).some((t) => t.kind === "HTTPRoute" && t.name === nameOf(r)));
        expect(attached.map(nameOf), `route ${nameOf(r)}`).toEqual([nameOf(eep)]);
      }
      const refs = list(at(eep, "spec.extProc.0.backendRefs"), `${nameOf(eep)} backendRefs`).map((b) => obj(b, "backendRef"));
      expect(refs.length).toBe(1);
      const ref = refs[0] as Obj;
      const svc = oneIn(installed(), "Service", str(ref.name, "backendRef name"), (ref.namespace as string | undefined) ?? nsOf(eep));
      expect(poolOf(svc), `${nameOf(eep)} -> Service ${nameOf(svc)}`).toBe(pool);
      const gw = gatewayOf(pool);
      // The Service leads to this pool's gateways and to nothing else.
      expect(workloadsSelectedBy(at(svc, "spec.selector"), nsOf(svc)), `Service ${nameOf(svc)} selects`).toEqual([gw.workload]);
      const grpc = obj(listOrEmpty(at(svc, "spec.ports")).find((p) => at(p, "name") === "grpc"), `Service ${nameOf(svc)} port grpc`);
      expect(ref.port).toBe(grpc.port);
      expect(grpc.port).toBe(intFlag(gw, "--port"));
      expect(grpc.appProtocol).toBe("kubernetes.io/h2c");
      expect(at(cportsOf(gw).find((p) => at(p, "name") === "grpc"), "containerPort")).toBe(intFlag(gw, "--port"));
    }
    // The base policy still serves the catch-all route with the unpooled gateways only.
    const base = one("EnvoyExtensionPolicy");
    const baseSvc = one("Service", str(at(base, "spec.extProc.0.backendRefs.0.name"), "base backendRef"), nsOf(base));
    expect(workloadsSelectedBy(at(baseSvc, "spec.selector"), nsOf(baseSvc)), "the unpooled gateway Service must not reach a pool's gateways").toEqual([gatewayOf(undefined).workload]);
  });

  const cportsOf = (inv: Invocation) => listOrEmpty(inv.container.ports);

  it("each pool's HTTPRoute matches exactly its models on the `model` header; no model is in two pools; the base route stays the catch-all", () => {
    const base = one("HTTPRoute", "llm");
    const baseMatches = list(at(base, "spec.rules.0.matches"), "base route matches");
    expect(
      listOrEmpty(at(base, "spec.rules")).every((r) => listOrEmpty(at(r, "matches")).every((m) => at(m, "headers") === undefined)),
      "the base route matches no header: every request no pool route takes lands there",
    ).toBe(true);
    const owner = new Map<string, string>();
    for (const pool of pools()) {
      const models = modelsOf(pool);
      expect(new Set(models).size, `pool ${pool}: --models lists a model twice`).toBe(models.length);
      for (const m of models) {
        expect(owner.get(m), `model ${m} is in pools ${owner.get(m)} and ${pool}`).toBeUndefined();
        owner.set(m, pool);
      }
      const routed: string[] = [];
      for (const r of kindIn(ofPool(pool), "HTTPRoute")) {
        expect(at(r, "spec.parentRefs"), `${nameOf(r)}: the same Gateway listener as the base route`).toEqual(at(base, "spec.parentRefs"));
        for (const rule of list(at(r, "spec.rules"), `${nameOf(r)} rules`)) {
          for (const m of list(at(rule, "matches"), `${nameOf(r)} matches`)) {
            expect(at(m, "path"), `${nameOf(r)}: the base route's path`).toEqual(at(baseMatches[0], "path"));
            const headers = list(at(m, "headers"), `${nameOf(r)} match headers`);
            expect(headers.length).toBe(1);
            expect([at(headers[0], "type"), at(headers[0], "name")]).toEqual(["Exact", "model"]);
            routed.push(str(at(headers[0], "value"), "model header value"));
          }
          // The same engines, the same timeout as the base route.
          expect(at(rule, "backendRefs"), `${nameOf(r)} backendRefs`).toEqual(at(base, "spec.rules.0.backendRefs"));
          for (const b of list(at(rule, "backendRefs"), "backendRefs")) one("Service", str(at(b, "name"), "backendRef name"), (at(b, "namespace") as string | undefined) ?? nsOf(r));
        }
      }
      expect(routed.sort(), `pool ${pool}: the route's model headers must be the Job's --models`).toEqual([...models].sort());
    }
  });

  it("each pool's BackendTrafficPolicy targets only its routes and reads the gateway's endpoint header", () => {
    for (const pool of pools()) {
      const btps = kindIn(ofPool(pool), "BackendTrafficPolicy");
      expect(btps.length).toBe(1);
      const btp = btps[0] as Obj;
      expect(targetsOf(btp).map((t) => t.name).sort()).toEqual(kindIn(ofPool(pool), "HTTPRoute").map(nameOf).sort());
      expect(at(btp, "spec.loadBalancer.endpointOverride.extractFrom")).toEqual([{ header: DESTINATION_HEADER }]);
      expect(at(btp, "spec.retry"), "a retried completion runs twice").toBeUndefined();
    }
  });

  it("timeouts: each pool's ext_proc, route, gateway shutdown and Envoy's idle timeout agree, as for the base", () => {
    const idle = seconds(at(one("ClientTrafficPolicy"), "spec.timeout.http.streamIdleTimeout"));
    for (const pool of pools()) {
      const gw = gatewayOf(pool);
      const ext = obj(at(kindIn(ofPool(pool), "EnvoyExtensionPolicy")[0], "spec.extProc.0"), `pool ${pool} extProc[0]`);
      expect(at(ext, "processingMode.request.body")).toBe("Buffered");
      expect(at(ext, "processingMode.response.body")).toBe("Streamed");
      expect(ext.failOpen).toBe(false);
      expect(seconds(ext.messageTimeout)).toBeGreaterThanOrEqual(30);
      const budgetMs = gw.flags.has("--pd-prefill-budget-ms") ? intFlag(gw, "--pd-prefill-budget-ms") : 50_000;
      expect(seconds(ext.messageTimeout) * 1000, `pool ${pool}: ext_proc message timeout vs the P/D prefill budget`).toBeGreaterThan(budgetMs);
      expect(at(ext, "backendSettings.healthCheck.active.grpc.service")).toBe("readiness");
      expect(at(gw.container, "readinessProbe.grpc")).toEqual({ port: intFlag(gw, "--port"), service: "readiness" });
      const graceS = intFlag(gw, "--shutdown-grace-ms") / 1000;
      const preStop = list(at(gw.container, "lifecycle.preStop.exec.command"), "preStop command");
      const sleepS = preStop[0] === "sleep" ? Number(preStop[1]) : 0;
      for (const r of kindIn(ofPool(pool), "HTTPRoute")) {
        for (const rule of list(at(r, "spec.rules"), "rules")) {
          const timeout = seconds(at(rule, "timeouts.request"));
          expect(graceS, `pool ${pool}: --shutdown-grace-ms must let the longest request of ${nameOf(r)} finish`).toBeGreaterThanOrEqual(timeout);
          expect(idle, `the stream idle timeout must not cut a silent completion on ${nameOf(r)}`).toBeGreaterThanOrEqual(timeout);
        }
      }
      expect(Number(at(gw.pod, "terminationGracePeriodSeconds"))).toBeGreaterThan(sleepS + graceS);
    }
  });

  it("no Deployment, Service or PodDisruptionBudget selects pods of another pool or of the base", () => {
    for (const o of installed()) {
      const selector = o.kind === "Service" ? at(o, "spec.selector") : o.kind === "Deployment" || o.kind === "PodDisruptionBudget" ? at(o, "spec.selector.matchLabels") : undefined;
      if (selector === undefined || (o.kind === "Service" && nsOf(o) !== "jetroute")) continue;
      const selected = workloadsSelectedBy(selector, nsOf(o));
      const where = `${String(o.kind)} ${nsOf(o)}/${nameOf(o)}`;
      expect(selected.length, `${where} selects no pod template`).toBeGreaterThan(0);
      expect([...new Set(selected.map(templatePoolOf))], `${where} selects pods of`).toEqual([poolOf(o)]);
      if (o.kind === "Deployment") expect(selected, `${where}: overlapping Deployment selectors`).toEqual([o]);
    }
  });

  it("pod-watchers: an HA pair per pool, each pool on its own source, so no two pairs contend for one Kubernetes Lease; RBAC like the base", () => {
    const leases = new Map<string, string>();
    const watchers = [invocationOf("pod-watcher"), ...pools().map((p) => processOf(p, "pod-watcher"))];
    for (const inv of watchers) {
      const owner = templatePoolOf(inv.workload) ?? "base";
      expect(Number(at(inv.workload, "spec.replicas")), inv.where).toBe(2);
      expect(inv.flags.get("--leader-election"), inv.where).toBe(true);
      expect(inv.flags.get("--kubernetes"), inv.where).toBe(true);
      expect(inv.flags.get("--lease-namespace"), inv.where).toBe("$(POD_NAMESPACE)");
      // A takeover fits inside the source timeout of the gateways that read this watcher (its pool's).
      const lease = intFlag(inv, "--lease-ms");
      expect(lease + 2 * Math.floor(lease / 3) + intFlag(inv, "--heartbeat-ms") + 2_000, `${inv.where}: takeover budget`).toBeLessThanOrEqual(
        intFlag(gatewayOf(templatePoolOf(inv.workload)), "--pod-source-timeout-ms"),
      );
      // services/pod-watcher/kubernetes.ts names the Lease after the pool and the source.
      const pool = inv.flags.get("--pool");
      const leaseName = `${nsOf(inv.workload)}/${watcherLeaseName(String(inv.flags.get("--source")), typeof pool === "string" ? pool : undefined)}`;
      expect(leases.get(leaseName), `Lease ${leaseName} of ${owner} is also ${leases.get(leaseName)}'s`).toBeUndefined();
      leases.set(leaseName, owner);
      // RBAC: pods in each watched namespace, leases in its own.
      const sa = str(at(inv.pod, "serviceAccountName"), `${inv.where} serviceAccountName`);
      oneIn(installed(), "ServiceAccount", sa, nsOf(inv.workload));
      const rules = (ns: string) =>
        kindIn(installed(), "RoleBinding")
          .filter((b) => nsOf(b) === ns && listOrEmpty(at(b, "subjects")).some((s) => at(s, "kind") === "ServiceAccount" && at(s, "name") === sa && at(s, "namespace") === nsOf(inv.workload)))
          .flatMap((b) => listOrEmpty(oneIn(installed(), str(at(b, "roleRef.kind"), "roleRef kind"), str(at(b, "roleRef.name"), "roleRef name"), at(b, "roleRef.kind") === "Role" ? nsOf(b) : undefined).rules));
      const verbs = (rs: unknown[], group: string, resource: string) =>
        rs.filter((r) => listOrEmpty(at(r, "apiGroups")).includes(group) && listOrEmpty(at(r, "resources")).includes(resource)).flatMap((r) => listOrEmpty(at(r, "verbs")));
      for (const ns of String(inv.flags.get("--namespaces")).split(",")) expect(verbs(rules(ns), "", "pods"), `${inv.where}: pods in ${ns}`).toEqual(expect.arrayContaining(["get", "list", "watch"]));
      expect(verbs(rules(nsOf(inv.workload)), "coordination.k8s.io", "leases"), `${inv.where}: leases`).toEqual(expect.arrayContaining(["get", "create", "update"]));
    }
    expect(leases.size).toBe(1 + pools().length);
  });

  it("NetworkPolicies: every pool pod is behind a pool policy naming only ports it opens; ext_proc only from the Envoy proxies of the routes' Gateway; NATS admits them", () => {
    const policies = kindIn(rendered(), "NetworkPolicy");
    const parent = obj(list(at(one("HTTPRoute", "llm"), "spec.parentRefs"), "parentRefs")[0], "parentRef");
    for (const pool of pools()) {
      for (const c of jetrouteContainers(ofPool(pool))) {
        const labels = obj(at(c.workload, "spec.template.metadata.labels"), "pod labels");
        expect(labels["app.kubernetes.io/part-of"], `${c.where}: the NATS policy admits part-of jetroute`).toBe("jetroute");
        const covering = policies.filter((np) => {
          const sel = obj(at(np, "spec.podSelector"), "podSelector");
          const ml = isObj(sel.matchLabels) ? sel.matchLabels : {};
          return (
            Object.entries(ml).every(([k, v]) => labels[k] === v) &&
            listOrEmpty(sel.matchExpressions).every((e) => at(e, "operator") === "In" && listOrEmpty(at(e, "values")).includes(labels[String(at(e, "key"))]))
          );
        });
        expect(covering.length, `${c.where}: no pool NetworkPolicy selects it`).toBe(1);
        const np = covering[0] as Obj;
        expect(at(np, "spec.policyTypes")).toEqual(["Ingress"]);
        const open = listOrEmpty(c.container.ports).flatMap((p) => [at(p, "name"), at(p, "containerPort")]);
        for (const rule of listOrEmpty(at(np, "spec.ingress"))) {
          for (const p of listOrEmpty(at(rule, "ports"))) expect(open, `${nameOf(np)}: ${c.where} has no port ${String(at(p, "port"))}`).toContain(at(p, "port"));
          if (listOrEmpty(at(rule, "ports")).some((p) => at(p, "port") === "grpc")) {
            expect(at(listOrEmpty(at(rule, "from"))[0], "podSelector.matchLabels")).toEqual({
              "gateway.envoyproxy.io/owning-gateway-name": parent.name,
              "gateway.envoyproxy.io/owning-gateway-namespace": (parent.namespace as string | undefined) ?? nsOf(one("HTTPRoute", "llm")),
            });
          }
        }
      }
    }
  });

  it("the ServiceMonitors scrape each pool's gateway, pod-watcher, metrics-scraper and kv-bridge once, on the port their metrics flag opens, and label them with the pool", () => {
    const scraped = new Map<string, number>();
    for (const sm of kinds("ServiceMonitor")) {
      expect(at(sm, "spec.targetLabels"), `${nameOf(sm)}: the pool label goes onto the metrics`).toEqual([POOL_LABEL]);
      for (const ep of listOrEmpty(at(sm, "spec.endpoints"))) {
        for (const svc of servicesSelectedBy(sm, installed())) {
          const sp = listOrEmpty(at(svc, "spec.ports")).find((p) => at(p, "name") === at(ep, "port"));
          const target = at(sp, "targetPort") ?? at(sp, "port");
          for (const { inv, port } of containersBehind(svc, installed())) {
            if (port.name !== target && port.containerPort !== target) continue;
            const m = METRICS_FLAG[inv.sub];
            expect(m, `${inv.where}: scraped, but \`jetroute ${inv.sub}\` serves no /metrics`).toBeDefined();
            expect(port.containerPort, `${inv.where}: the scraped container port must be ${m?.flag}`).toBe(intFlag(inv, m?.flag ?? ""));
            const key = `${templatePoolOf(inv.workload) ?? "base"} ${inv.sub}`;
            scraped.set(key, (scraped.get(key) ?? 0) + 1);
          }
        }
      }
    }
    // The autoscaler is one per installation (deploy/autoscaler), not copied per pool.
    for (const pool of ["base", ...pools()]) for (const sub of Object.keys(METRICS_FLAG)) if (pool === "base" || sub !== "autoscaler") expect(scraped.get(`${pool} ${sub}`), `${pool}: \`jetroute ${sub}\` scraped once`).toBe(1);
  });

  it("pool processes take the base processes' NATS Secrets (the same NATS users), optional", () => {
    for (const pool of pools()) {
      for (const c of jetrouteContainers(ofPool(pool))) {
        const component = String((at(c.workload, "spec.template.metadata.labels") as Obj)["app.kubernetes.io/component"]);
        const secret = `jetroute-nats-${component === "set-pool" ? "admin" : component}`;
        const refs = listOrEmpty(c.container.env).filter((e) => at(e, "valueFrom.secretKeyRef") !== undefined && String(at(e, "name")).startsWith("NATS_"));
        expect(refs.map((e) => at(e, "name")).sort(), c.where).toEqual(["NATS_PASSWORD", "NATS_TOKEN", "NATS_USER"]);
        for (const e of refs) {
          expect(at(e, "valueFrom.secretKeyRef.name"), c.where).toBe(secret);
          expect(at(e, "valueFrom.secretKeyRef.optional"), c.where).toBe(true);
        }
        // The shared ConfigMap the base installs (NATS_URL, JETROUTE_PREFIX).
        for (const src of listOrEmpty(c.container.envFrom)) one("ConfigMap", str(at(src, "configMapRef.name"), "configMapRef"), nsOf(c.workload));
      }
    }
  });
});
