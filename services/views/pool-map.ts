/**
 * Which gateway pool serves which model, from the config bucket's `pool.<name>` entries. Pure.
 *
 * A model listed by two pools belongs to the one whose name sorts first (every gateway then gives
 * the same answer), and the clash is reported so the operator can fix the config.
 */

export class PoolMap {
  private readonly pools = new Map<string, readonly string[]>();
  private byModel = new Map<string, string>();
  /** Models listed by more than one pool: model -> the pools listing it. */
  private clashes = new Map<string, string[]>();

  /** Sets (or with `undefined` removes) a pool's models. */
  set(pool: string, models: readonly string[] | undefined): void {
    if (models === undefined) this.pools.delete(pool);
    else this.pools.set(pool, [...models]);
    this.rebuild();
  }

  /** The pool serving `model`, if any pool lists it. */
  poolOf(model: string): string | undefined {
    return this.byModel.get(model);
  }

  /** A pool's models as configured (undefined: no such pool in the config). */
  modelsOf(pool: string): readonly string[] | undefined {
    return this.pools.get(pool);
  }

  names(): string[] {
    return [...this.pools.keys()].sort();
  }

  /** Models listed by more than one pool, with the pools listing them (sorted; the first one wins). */
  conflicts(): Array<{ model: string; pools: string[] }> {
    return [...this.clashes].map(([model, pools]) => ({ model, pools }));
  }

  private rebuild(): void {
    const byModel = new Map<string, string>();
    const clashes = new Map<string, string[]>();
    for (const pool of this.names()) {
      for (const model of this.pools.get(pool) ?? []) {
        const owner = byModel.get(model);
        if (owner === undefined) {
          byModel.set(model, pool);
          continue;
        }
        const list = clashes.get(model) ?? [owner];
        list.push(pool);
        clashes.set(model, list);
      }
    }
    this.byModel = byModel;
    this.clashes = clashes;
  }
}
