/**
 * One pino logger per process; services derive children with `{ svc: "gateway" }` etc.
 * Logs go to stderr: stdout is reserved for the one-line JSON announcements (endpoints, results)
 * that the demo, tests and benchmarks parse.
 */
import { destination, pino, type Logger } from "pino";

export type { Logger };

export function createLogger(service: string, level = process.env.JETROUTE_LOG_LEVEL ?? "info"): Logger {
  return pino({ level, base: { svc: service, pid: process.pid } }, destination({ fd: 2, sync: true }));
}
