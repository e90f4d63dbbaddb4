/** One pino logger per process; services derive children with `{ svc: "gateway" }` etc. */
import { pino, type Logger } from "pino";

export type { Logger };

export function createLogger(service: string, level = process.env.JETROUTE_LOG_LEVEL ?? "info"): Logger {
  return pino({ level, base: { svc: service, pid: process.pid } });
}
