// Preact hooks over the live collections and the metrics readings.

import { useEffect, useRef, useState } from 'preact/hooks';

import { follow } from './live.js';

/** `{items, error, synced}` for the collection at `path` (null: none). */
export function useCollection(path) {
  const [state, setState] = useState({ items: [], error: null, synced: false });
  useEffect(() => {
    setState({ items: [], error: null, synced: false });
    if (!path) return undefined;
    return follow(path, {
      onChange: (items) => setState((s) => ({ ...s, items, synced: true })),
      onError: (error) => setState((s) => ({ ...s, error })),
    });
  }, [path]);
  return state;
}

/** Calls `tick` now and every `ms` while the page is visible. */
export function useInterval(tick, ms) {
  // The latest `tick`, so a new closure each render is what runs.
  const latest = useRef(tick);
  latest.current = tick;
  useEffect(() => {
    let stopped = false;
    let timer;
    const round = async () => {
      try {
        if (!document.hidden) await latest.current();
      } finally {
        if (!stopped) timer = setTimeout(round, ms);
      }
    };
    round();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [ms]);
}
