// A small event emitter: on(type, fn) returns a function that unsubscribes.

/** @template T @typedef {(value: T) => void} Listener */

export class Emitter {
  constructor() {
    /** @type {Map<string, Set<Function>>} */
    this._listeners = new Map();
  }

  /**
   * Call `fn` for every emission of `type` ("*" receives every emission as (value, type)).
   * @param {string} type
   * @param {Function} fn
   * @returns {() => void} unsubscribe
   */
  on(type, fn) {
    let set = this._listeners.get(type);
    if (!set) this._listeners.set(type, (set = new Set()));
    set.add(fn);
    return () => this.off(type, fn);
  }

  /** @param {string} type @param {Function} fn */
  off(type, fn) {
    this._listeners.get(type)?.delete(fn);
  }

  /**
   * Call `fn` once, for the next emission of `type`.
   * @param {string} type
   * @param {Function} fn
   * @returns {() => void} unsubscribe
   */
  once(type, fn) {
    const off = this.on(type, (value, t) => {
      off();
      fn(value, t);
    });
    return off;
  }

  /** @param {string} type @param {unknown} value */
  emit(type, value) {
    for (const key of [type, "*"]) {
      const set = this._listeners.get(key);
      if (!set) continue;
      for (const fn of [...set]) {
        try {
          fn(value, type);
        } catch (err) {
          // A listener's bug must not break the stream: report it and go on.
          setTimeout(() => {
            throw err;
          });
        }
      }
    }
  }
}
