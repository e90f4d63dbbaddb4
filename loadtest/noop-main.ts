/** Child-process entry for the no-op ext_proc baseline: prints `{"port":N}` and serves until SIGTERM. */
import { startNoopExtProc } from "../services/extproc/noop-server.js";
import { untilSignal } from "../services/shared/cli-options.js";

const srv = await startNoopExtProc({ port: 0, host: "127.0.0.1" });
console.log(JSON.stringify({ port: srv.port }));
await untilSignal();
await srv.close();
process.exit(0);
