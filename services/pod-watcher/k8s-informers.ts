/**
 * The pod informers of pod-watcher --kubernetes (kubernetes.ts): their watches, their restarts, and
 * whether they still see the cluster.
 *
 * The informer stops on any watch error (a dropped connection fires "Premature close"); it is
 * restarted with backoff, resuming from its last resourceVersion (a 410 makes it relist). The
 * backoff starts over only once a watch delivered something, so a watch that fails right after
 * connecting keeps backing off instead of retrying every 100-200 ms.
 * client-node's `makeInformer` never asks for bookmarks; ours is the same ListWatch on a Watch
 * that adds `allowWatchBookmarks=true` (the server's BOOKMARKs keep the resourceVersion recent, so
 * a reconnect after a quiet spell resumes instead of relisting) and `timeoutSeconds` (5-10
 * minutes, as client-go's reflector asks). `timeoutSeconds` is only the server's promise to end
 * the watch: a connection the server never closes (half-open after a network fault) would stay
 * silent for good, and client-node's own request timeout does not help (it overwrites its abort
 * signal). So each watch has a client-side watchdog: nothing (no event, no BOOKMARK) within
 * `timeoutSeconds` plus a margin aborts it, and the informer restarts.
 */
import { type CoreV1Api, type Informer, type KubeConfig, type KubernetesObject, ListWatch, type ObjectCache, type V1Pod, Watch } from "@kubernetes/client-node";
import type { Logger } from "../shared/log.js";
import { backoffDelayMs, DEFAULT_BACKOFF } from "./backoff.js";

/**
 * A Watch that asks for bookmarks and a server-side timeout on every watch request, and aborts a
 * watch that stays silent past that timeout (plus a margin) itself.
 */
class BookmarkingWatch extends Watch {
  constructor(
    kc: KubeConfig,
    private readonly range: [number, number],
    private readonly marginMs: number,
    /** Something arrived on a watch (an event or a BOOKMARK): the connection works. */
    private readonly onActivity: () => void,
    private readonly onStall: () => void,
  ) {
    super(kc);
  }

  override async watch(path: string, queryParams: Record<string, unknown>, callback: (phase: string, apiObj: unknown, watchObj?: unknown) => void, done: (err: unknown) => void): Promise<AbortController> {
    const [lo, hi] = this.range;
    const timeoutSeconds = lo + Math.floor(Math.random() * Math.max(1, hi - lo));
    const limitMs = timeoutSeconds * 1_000 + this.marginMs;
    let finished = false;
    let controller: AbortController | undefined;
    let timer: NodeJS.Timeout | undefined;
    const finish = (err: unknown) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      done(err);
    };
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        this.onStall();
        controller?.abort();
        finish(new Error(`watch silent for ${limitMs} ms (no event, no BOOKMARK, not closed): aborted`));
      }, limitMs);
    };
    arm();
    controller = await super.watch(path, { ...queryParams, allowWatchBookmarks: true, timeoutSeconds }, (phase, obj, w) => {
      if (finished) return;
      arm();
      this.onActivity();
      callback(phase, obj, w);
    }, finish);
    if (finished) controller.abort();
    return controller;
  }
}

export interface Watched {
  namespace: string | undefined;
  informer: Informer<V1Pod> & ObjectCache<V1Pod>;
  synced: boolean;
  attempt: number;
  restart?: NodeJS.Timeout;
  /** Since when (local ms) this informer has been unsynced or failing; undefined = healthy. */
  blindSince?: number;
  errors: number;
}

export interface InformerSettings {
  kc: KubeConfig;
  api: CoreV1Api;
  labelSelector: string;
  /** Watch `timeoutSeconds` range; the watchdog fires `marginMs` after it. */
  range: [number, number];
  marginMs: number;
  /** A watch stayed silent past its timeout and was aborted. */
  onStall: () => void;
}

/** An informer on the pods matching the label selector in `namespace` (undefined = all namespaces), blind until it lists. */
export function watchPods(namespace: string | undefined, s: InformerSettings): Watched {
  const { api, labelSelector } = s;
  const path = namespace ? `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods` : "/api/v1/pods";
  const list = namespace ? () => api.listNamespacedPod({ namespace, labelSelector }) : () => api.listPodForAllNamespaces({ labelSelector });
  const w: Watched = { namespace, informer: undefined as unknown as Watched["informer"], synced: false, attempt: 0, blindSince: Date.now(), errors: 0 };
  const watch = new BookmarkingWatch(s.kc, s.range, s.marginMs, () => {
    w.attempt = 0;
    w.blindSince = undefined;
  }, s.onStall);
  w.informer = new ListWatch<V1Pod>(path, watch, list, false, labelSelector);
  return w;
}

/**
 * An informer on any list/watch path (custom resources: an InferencePool and its objectives), with
 * the same bookmarks, watchdog and blindness accounting as `watchPods`. `what` names it in logs.
 */
export function watchObjects(path: string, list: () => Promise<KubernetesObjectList>, s: Omit<InformerSettings, "api" | "labelSelector">, what: string): Watched {
  const w: Watched = { namespace: what, informer: undefined as unknown as Watched["informer"], synced: false, attempt: 0, blindSince: Date.now(), errors: 0 };
  const watch = new BookmarkingWatch(s.kc, s.range, s.marginMs, () => {
    w.attempt = 0;
    w.blindSince = undefined;
  }, s.onStall);
  w.informer = new ListWatch<KubernetesObject>(path, watch, list as never, false) as unknown as Watched["informer"];
  return w;
}

/** A list as client-node's list functions return it. */
export interface KubernetesObjectList {
  metadata?: { resourceVersion?: string };
  items: KubernetesObject[];
}

/** Whether some informer has been unsynced or failing for at least `blindAfterMs` at `now`. */
export function informersBlind(watched: readonly Pick<Watched, "blindSince">[], now: number, blindAfterMs: number): boolean {
  return watched.some((w) => w.blindSince !== undefined && now - w.blindSince >= blindAfterMs);
}

export interface Supervision {
  log: Logger;
  /** The watcher's counters this supervision keeps. */
  own: { informerErrors: number; informerRestarts: number; backoffAttempt: number };
  stopped: () => boolean;
  /** An informer's cache changed (or it synced). */
  changed: () => void;
}

/**
 * Starts every informer, reports their cache changes, and restarts each one that fails (with
 * backoff, one restart pending at a time). Resolves once every first start returned.
 */
export function superviseInformers(watched: Watched[], s: Supervision): Promise<unknown> {
  const { log, own } = s;
  const start = async (w: Watched): Promise<void> => {
    const errorsBefore = w.errors;
    try {
      await w.informer.start();
      // A failed list does not reject start(): it fires "error" (which schedules the restart)
      // and leaves no resourceVersion behind.
      if (!(w.informer as unknown as { latestResourceVersion(): string }).latestResourceVersion()) return;
      // Listed (or resumed) without an error meanwhile (a refused watch errors inside start()): it
      // sees the cluster again. The backoff restarts only once the watch delivers something.
      if (w.errors === errorsBefore) w.blindSince = undefined;
      if (!w.synced) {
        w.synced = true;
        log.info({ namespace: w.namespace ?? "(all)", pods: w.informer.list().length }, "informer synced");
      }
      s.changed();
    } catch (err) {
      onError(w, err);
    }
  };
  const onError = (w: Watched, err: unknown) => {
    if (s.stopped() || w.restart) return;
    own.informerErrors++;
    w.errors++;
    w.blindSince ??= Date.now();
    const delay = backoffDelayMs(w.attempt++, Math.random(), DEFAULT_BACKOFF);
    own.backoffAttempt = Math.max(...watched.map((x) => x.attempt));
    log.warn({ namespace: w.namespace ?? "(all)", err: (err as Error)?.message ?? String(err), retryInMs: delay }, "pod watch failed; restarting");
    w.restart = setTimeout(() => {
      w.restart = undefined;
      own.informerRestarts++;
      void start(w);
    }, delay);
  };
  for (const w of watched) {
    for (const verb of ["add", "update", "delete"] as const) w.informer.on(verb, (_obj: KubernetesObject) => s.changed());
    w.informer.on("error", (err: unknown) => onError(w, err));
  }
  return Promise.all(watched.map((w) => start(w)));
}

/**
 * The watchers' common start: supervises the informers (each change counted and handed to `derive`)
 * and resolves once every informer's first start returned and, when all of them synced while this
 * watcher publishes, the publisher confirmed the first derived set.
 */
export function superviseUntilFirstRound(
  watched: Watched[],
  s: Omit<Supervision, "changed" | "own"> & {
    own: Supervision["own"] & { events: number };
    derive: () => void;
    publisher: { readonly isActive: boolean; whenSynced(): Promise<unknown> };
  },
): Promise<void> {
  const starting = superviseInformers(watched, {
    log: s.log,
    own: s.own,
    stopped: s.stopped,
    changed: () => {
      s.own.events++;
      s.derive();
    },
  });
  return starting.then(async () => {
    await new Promise((r) => setImmediate(r));
    if (watched.every((w) => w.synced) && s.publisher.isActive) await s.publisher.whenSynced();
  });
}
