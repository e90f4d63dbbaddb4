/**
 * Dependency direction, checked in `npm test`:
 *   schemas <- streams <- services/views <- services/routing <- shells (gateway, replay, ...)
 *   schemas <- streams <- services/shared <- shells
 * Pure cores (views, the routing core) import no I/O; views import nothing above them; the
 * routing core imports no shell; publishers and replay never import the gateway.
 */
const IO =
  "^(node:)?(http|https|http2|net|dgram|fs|child_process)$|(^|node_modules/)(@nats-io|@grpc|grpc-health-check|zeromq|pino|undici|prom-client)/|^services/shared/(log|nats|follower|publish|dead-letter)";

module.exports = {
  forbidden: [
    {
      name: "pure-core-no-io",
      comment: "Views, the routing core and the autoscaler's decisions are pure: no NATS, gRPC, HTTP, file system or logger.",
      severity: "error",
      from: { path: "^services/(views|routing|tokenizer)/|^services/batch/(model|view)\\.ts$|^services/replay/(engine|whatif|virtual-clock|window|report-types|message-log|counterfactuals|sim-pods|sim-prompts|elastic-fleet|autoscale-whatif)\\.ts$|^services/autoscaler/(window|kpa|apa|evaluator|pd-planner|victims|drain|signals|outcomes|runner|acks|apply-plan)\\.ts$|^services/adapters/(placement|demand|status)\\.ts$" },
      to: { path: IO },
    },
    {
      name: "views-are-the-bottom-of-services",
      comment: "Views import schemas, streams' pure helpers and each other: nothing above them (a check they need is injected).",
      severity: "error",
      from: { path: "^services/views/", pathNot: "\\.test\\.ts$" },
      to: { path: "^services/(?!views/)" },
    },
    {
      name: "routing-core-no-shells",
      comment: "The routing core (services/routing/) reads views and pure helpers; shells call it, never the other way.",
      severity: "error",
      from: { path: "^services/routing/" },
      to: { path: "^services/(gateway|extproc|front|sim|pod-watcher|metrics-scraper|kv-bridge|replay|admin|demo|kube-standin|shared/(?!seeded-random|min-heap))/" },
    },
    {
      name: "routing-core-through-its-surface",
      comment: "Outside services/routing/, the routing core is imported through services/routing/mod.ts only (tests and test helpers excepted).",
      severity: "error",
      from: { path: "^(services|loadtest|streams|schemas)/", pathNot: "^services/routing/|\\.test\\.ts$|(^|/)testing\\.ts$" },
      to: { path: "^services/routing/", pathNot: "^services/routing/mod\\.ts$|(^|/)testing\\.ts$" },
    },
    {
      name: "replay-never-imports-the-gateway",
      comment: "Replay re-decides with the routing core itself, not with the gateway shell.",
      severity: "error",
      from: { path: "^services/replay/" },
      to: { path: "^services/gateway/" },
    },
    {
      name: "schemas-are-the-bottom",
      severity: "error",
      from: { path: "^schemas/" },
      to: { path: "^(streams|services|loadtest)/" },
    },
    {
      name: "streams-below-services",
      severity: "error",
      from: { path: "^streams/", pathNot: "\\.test\\.ts$" },
      to: { path: "^(services|loadtest)/" },
    },
    {
      name: "publishers-never-import-the-gateway",
      severity: "error",
      from: { path: "^services/(pod-watcher|metrics-scraper|kv-bridge|sim)/" },
      to: { path: "^services/gateway/" },
    },
    {
      name: "no-circular",
      severity: "error",
      from: {},
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "^dist/" },
    tsConfig: { fileName: "tsconfig.json" },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { exportsFields: ["exports"], conditionNames: ["import", "require", "node", "default"] },
  },
};
