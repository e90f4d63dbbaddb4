/**
 * Dependency direction, checked in `npm test`:
 *   schemas <- streams <- services/shared <- services/*
 * Pure cores (views, strategies) import no I/O; publishers never import the gateway.
 */
const IO =
  "^(node:)?(http|https|http2|net|dgram|fs|child_process)$|(^|node_modules/)(@nats-io|@grpc|grpc-health-check|zeromq|pino|undici|prom-client)/|^services/shared/(log|nats|follower|publish|dead-letter)";

module.exports = {
  forbidden: [
    {
      name: "pure-core-no-io",
      comment: "Views and strategies are pure: no NATS, gRPC, HTTP, file system or logger.",
      severity: "error",
      from: { path: "^services/(views|gateway/strategies|gateway/stages|tokenizer)/|^services/replay/(engine|whatif|virtual-clock|window|report-types)\\.ts$" },
      to: { path: IO },
    },
    {
      name: "pure-core-no-shells",
      comment: "Views and strategies do not reach into the shells that feed them.",
      severity: "error",
      from: { path: "^services/(views|gateway/strategies)/" },
      to: { path: "^services/(gateway/(?!strategies/)|extproc|front|sim|pod-watcher|metrics-scraper|shared)" },
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
