/**
 * In-process ext_proc servers for tests: the gateway's real ext_proc handler on a real gRPC server
 * (Envoy's protos) on a free port, and the Envoy-like client that drives it. Close them all after
 * each test with `closeAll()`.
 */
import * as grpc from "@grpc/grpc-js";
import { ExtProcClient } from "../../services/extproc/envoy-client.js";
import { EXT_PROC_SERVER_OPTIONS, loadExtProc } from "../../services/extproc/protos.js";
import { createExtProcHandler, type ExtProcHandlerOptions } from "../../services/gateway/extproc-server.js";
import { createLogger } from "../../services/shared/log.js";

const silent = createLogger("test", "silent");

export class ExtProcTestServers {
  private readonly running: Array<{ client: ExtProcClient; server: grpc.Server }> = [];

  /** Serves a handler (silent log, always ready, no models listed unless given) and returns a client. */
  async serve(opts: Partial<ExtProcHandlerOptions> & Pick<ExtProcHandlerOptions, "router">): Promise<ExtProcClient> {
    const server = new grpc.Server(EXT_PROC_SERVER_OPTIONS);
    server.addService(loadExtProc().service, { Process: createExtProcHandler({ log: silent, isReady: () => true, listModels: () => [], ...opts }) });
    const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
    const client = new ExtProcClient(`127.0.0.1:${port}`);
    this.running.push({ client, server });
    return client;
  }

  closeAll(): void {
    for (const s of this.running.splice(0)) {
      s.client.close();
      s.server.forceShutdown();
    }
  }
}
