/**
 * The InferencePool flavour (deploy/inference-pool/), checked as `kubectl kustomize` renders each
 * overlay: the pool selects the model server's pods on their serving port, its endpoint picker
 * reference leads to jetroute's gateway (Service, port, container, --port), the HTTPRoute sends
 * to the pool, the pod-watcher watches that pool with RBAC to read it, and every jetroute command
 * line uses flags the CLI defines.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { DEFAULT_MAX_BODY_BYTES } from "../services/gateway/extproc-server.js";
import { registerGatewayCommand } from "../services/gateway/command.js";
import { INFERENCE_POOL_API_VERSION, parseInferencePool, selects } from "../services/pod-watcher/inference-pool.js";
import { registerPodWatcherCommand } from "../services/pod-watcher/command.js";

const DEPLOY = path.dirname(fileURLToPath(import.meta.url));
type Obj = Record<string, any>;

function kustomize(dir: string): Obj[] {
  const out = execFileSync("kubectl", ["kustomize", path.join(DEPLOY, dir)], { encoding: "utf8", timeout: 60_000, stdio: ["ignore", "pipe", "pipe"] });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}

/** The long flags a sub-command registers. */
function flagsOf(register: (p: Command) => void, sub: string): Set<string> {
  const program = new Command("jetroute");
  register(program);
  const cmd = program.commands.find((c) => c.name() === sub);
  return new Set((cmd?.options ?? []).map((o) => o.long as string));
}
const FLAGS: Record<string, Set<string>> = { gateway: flagsOf(registerGatewayCommand, "gateway"), "pod-watcher": flagsOf(registerPodWatcherCommand, "pod-watcher") };

const containers = (objs: Obj[]) =>
  objs.filter((o) => o.kind === "Deployment").flatMap((d) => (d.spec.template.spec.containers as Obj[]).map((c) => ({ d, c })));
const jetroute = (objs: Obj[], sub: string) => containers(objs).filter(({ c }) => /(^|\/)jetroute(:|@|$)/.test(c.image) && c.args?.[0] === sub);
const flag = (args: string[], name: string) => args.find((a) => a.startsWith(`${name}=`))?.slice(name.length + 1);

for (const flavour of ["generic", "envoy-gateway"]) {
  describe(`deploy/inference-pool/${flavour} (as kubectl kustomize renders it)`, () => {
    const objs = kustomize(path.join("inference-pool", flavour));
    const of = (kind: string) => objs.filter((o) => o.kind === kind);
    const pool = of("InferencePool")[0] as Obj;

    it("renders one valid InferencePool v1 (what the pod-watcher accepts)", () => {
      expect(of("InferencePool")).toHaveLength(1);
      expect(pool.apiVersion).toBe(INFERENCE_POOL_API_VERSION);
      expect(parseInferencePool(pool)).toMatchObject({ ok: true });
    });

    it("the pool's selector matches the model server's pods, and its target ports are ports those pods serve on", () => {
      const servers = of("Deployment").filter((d) => d.metadata.namespace === pool.metadata.namespace && selects(pool.spec.selector.matchLabels, d.spec.template.metadata.labels));
      expect(servers.map((d) => d.metadata.name)).toEqual(["vllm-llama3-8b"]);
      const ports = (servers[0]?.spec.template.spec.containers as Obj[]).flatMap((c) => (c.ports ?? []).map((p: Obj) => p.containerPort));
      for (const t of pool.spec.targetPorts) expect(ports).toContain(t.number);
      // No jetroute pod is a pool member.
      for (const { d } of containers(objs).filter(({ c }) => /jetroute/.test(c.image))) expect(selects(pool.spec.selector.matchLabels, d.spec.template.metadata.labels)).toBe(false);
    });

    it("the endpoint picker reference leads to jetroute gateway replicas: Service, port, container port and --port agree; gRPC over h2c", () => {
      const ref = pool.spec.endpointPickerRef;
      expect(["FailOpen", "FailClose"]).toContain(ref.failureMode);
      const svc = of("Service").find((s) => s.metadata.name === ref.name && s.metadata.namespace === pool.metadata.namespace) as Obj;
      expect(svc).toBeDefined();
      const port = (svc.spec.ports as Obj[]).find((p) => p.port === ref.port.number) as Obj;
      expect(port).toMatchObject({ appProtocol: "kubernetes.io/h2c" });
      const pickers = jetroute(objs, "gateway").filter(({ d }) => d.metadata.namespace === svc.metadata.namespace && selects(svc.spec.selector, d.spec.template.metadata.labels));
      expect(pickers).toHaveLength(1);
      const { d, c } = pickers[0] as { d: Obj; c: Obj };
      const cport = (c.ports as Obj[]).find((p) => p.name === port.targetPort || p.containerPort === port.targetPort) as Obj;
      expect(Number(flag(c.args, "--port"))).toBe(cport.containerPort);
      expect(flag(c.args, "--host")).toBe("0.0.0.0");
      expect(d.spec.replicas).toBeGreaterThanOrEqual(2);
      expect(c.readinessProbe.grpc).toEqual({ port: cport.containerPort, service: "readiness" });
    });

    it("the HTTPRoute's backend is the pool, on a Gateway of this overlay", () => {
      const routes = of("HTTPRoute");
      expect(routes).toHaveLength(1);
      const route = routes[0] as Obj;
      const refs = (route.spec.rules as Obj[]).flatMap((r) => r.backendRefs);
      expect(refs).toEqual([expect.objectContaining({ group: "inference.networking.k8s.io", kind: "InferencePool", name: pool.metadata.name })]);
      expect(route.metadata.namespace).toBe(pool.metadata.namespace);
      const gw = of("Gateway").find((g) => g.metadata.name === route.spec.parentRefs[0].name && g.metadata.namespace === route.metadata.namespace) as Obj;
      expect(gw).toBeDefined();
      expect((gw.spec.listeners as Obj[]).map((l) => l.name)).toContain(route.spec.parentRefs[0].sectionName);
      if (flavour === "envoy-gateway") {
        // GatewayClass jetroute comes from deploy/envoy-gateway (Envoy Gateway's controller).
        expect(gw.spec.gatewayClassName).toBe("jetroute");
        expect(readFileSync(path.join(DEPLOY, "envoy-gateway", "gatewayclass.yaml"), "utf8")).toMatch(/name: jetroute\b/);
        const ctp = of("ClientTrafficPolicy")[0] as Obj;
        expect(ctp.spec.targetRefs[0]).toMatchObject({ kind: "Gateway", name: gw.metadata.name });
        expect(Number.parseInt(ctp.spec.connection.bufferLimit, 10) * 2 ** 20).toBeGreaterThanOrEqual(DEFAULT_MAX_BODY_BYTES);
      }
    });

    it("the pod-watcher watches this pool (namespace/name, API version) as an HA pair, with RBAC to read it, its pods, objectives and rewrites, and hold its Lease", () => {
      const watchers = jetroute(objs, "pod-watcher");
      expect(watchers).toHaveLength(1);
      const { d, c } = watchers[0] as { d: Obj; c: Obj };
      expect(flag(c.args, "--inference-pool")).toBe(`${pool.metadata.namespace}/${pool.metadata.name}`);
      expect(flag(c.args, "--inference-pool-api-version")).toBe(pool.apiVersion);
      expect(c.args).toContain("--leader-election");
      expect(flag(c.args, "--source")).toBeTruthy();
      // Engines name their own models: the watcher publishes only the pool's (the model server's --model).
      const modelArg = (args: string[]) => (args.includes("--model") ? args[args.indexOf("--model") + 1] : flag(args, "--model"));
      const served = of("Deployment").flatMap((x) => (x.spec.template.spec.containers as Obj[]).map((k) => modelArg((k.args ?? []) as string[]))).filter(Boolean);
      expect(served.length).toBeGreaterThan(0);
      expect(flag(c.args, "--model-label") ?? flag(c.args, "--inference-pool-models")).toBeTruthy();
      for (const m of served) expect((flag(c.args, "--inference-pool-models") ?? "").split(",")).toContain(m);
      expect(d.spec.replicas).toBe(2);
      const sa = d.spec.template.spec.serviceAccountName;
      const bindings = of("RoleBinding").filter((b) => b.metadata.namespace === pool.metadata.namespace && (b.subjects as Obj[]).some((s) => s.kind === "ServiceAccount" && s.name === sa));
      const rules = bindings.flatMap((b) => (of("Role").find((r) => r.metadata.name === b.roleRef.name && r.metadata.namespace === b.metadata.namespace)?.rules ?? []) as Obj[]);
      const allows = (group: string, resource: string, verbs: string[]) => rules.some((r) => r.apiGroups.includes(group) && r.resources.includes(resource) && verbs.every((v) => r.verbs.includes(v)));
      expect(allows("inference.networking.k8s.io", "inferencepools", ["get", "list", "watch"])).toBe(true);
      expect(allows("", "pods", ["get", "list", "watch"])).toBe(true);
      const objectivesGroup = (flag(c.args, "--objectives-api-version") ?? "").split("/")[0] as string;
      expect(allows(objectivesGroup, "inferenceobjectives", ["get", "list", "watch"])).toBe(true);
      expect(allows(objectivesGroup, "inferencemodelrewrites", ["get", "list", "watch"])).toBe(true);
      expect(allows("coordination.k8s.io", "leases", ["get", "create", "update"])).toBe(true);
      expect(flag(c.args, "--lease-namespace")).toBe("$(POD_NAMESPACE)");
    });

    it("NATS (namespace jetroute) admits the pool namespace's jetroute pods, which every jetroute pod there is", () => {
      const np = of("NetworkPolicy").find((n) => n.metadata.namespace === "jetroute") as Obj;
      const from = np.spec.ingress[0].from[0];
      expect(from.namespaceSelector.matchLabels).toEqual({ "kubernetes.io/metadata.name": pool.metadata.namespace });
      expect(np.spec.ingress[0].ports).toEqual([{ port: 4222, protocol: "TCP" }]);
      for (const { d } of containers(objs).filter(({ c }) => /jetroute/.test(c.image))) expect(selects(from.podSelector.matchLabels, d.spec.template.metadata.labels)).toBe(true);
      const cm = of("ConfigMap").find((c) => c.metadata.name === "jetroute-config") as Obj;
      expect(cm.data.NATS_URL).toMatch(/\.jetroute\.svc:4222$/);
    });

    it("every jetroute command line uses only flags its sub-command defines", () => {
      for (const { c } of containers(objs).filter(({ c }) => /jetroute/.test(c.image))) {
        const known = FLAGS[c.args[0]] as Set<string>;
        expect(known, c.args[0]).toBeDefined();
        for (const a of (c.args as string[]).slice(1)) expect(known.has(a.split("=")[0] as string), `${c.args[0]} ${a}`).toBe(true);
      }
    });
  });
}
