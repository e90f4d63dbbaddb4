/**
 * A binary min-heap whose items know their own position, so any item can be removed in O(log n)
 * (a held request leaves its flow's, its band's and the expiry heap when its client goes away).
 * The shared `MinHeap` has no removal; lazy deletion would keep cancelled requests' memory until
 * they surfaced, which breaks the queue's bounded-memory rule.
 *
 * One item may sit in several heaps: each heap reads and writes its own position slot through
 * `pos`/`setPos` (-1 = not in this heap).
 */
export class IndexedHeap<N> {
  private h: N[] = [];

  constructor(
    private readonly less: (a: N, b: N) => boolean,
    private readonly pos: (n: N) => number,
    private readonly setPos: (n: N, i: number) => void,
  ) {}

  get size(): number {
    return this.h.length;
  }

  peek(): N | undefined {
    return this.h[0];
  }

  /** The heap's array (heap order, not sorted): for copies and scans, never to be mutated. */
  items(): readonly N[] {
    return this.h;
  }

  push(n: N): void {
    this.h.push(n);
    this.up(this.h.length - 1, n);
  }

  pop(): N | undefined {
    const top = this.h[0];
    if (top !== undefined) this.remove(top);
    return top;
  }

  /** Removes `n` if it is in this heap; false otherwise. */
  remove(n: N): boolean {
    const i = this.pos(n);
    const h = this.h;
    if (i < 0 || i >= h.length || h[i] !== n) return false;
    this.setPos(n, -1);
    const last = h.pop() as N;
    if (i === h.length) return true;
    h[i] = last;
    if (i > 0 && this.less(last, h[(i - 1) >> 1] as N)) this.up(i, last);
    else this.down(i, last);
    return true;
  }

  /** Restores the heap order after the ordering itself changed (O(n)). */
  rebuild(): void {
    const h = this.h;
    for (let i = 0; i < h.length; i++) this.setPos(h[i] as N, i);
    for (let i = (h.length >> 1) - 1; i >= 0; i--) this.down(i, h[i] as N);
  }

  private up(i: number, n: N): void {
    const h = this.h;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = h[p] as N;
      if (!this.less(n, parent)) break;
      h[i] = parent;
      this.setPos(parent, i);
      i = p;
    }
    h[i] = n;
    this.setPos(n, i);
  }

  private down(i: number, n: N): void {
    const h = this.h;
    const len = h.length;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= len) break;
      const r = l + 1;
      const c = r < len && this.less(h[r] as N, h[l] as N) ? r : l;
      const child = h[c] as N;
      if (!this.less(child, n)) break;
      h[i] = child;
      this.setPos(child, i);
      i = c;
    }
    h[i] = n;
    this.setPos(n, i);
  }
}
